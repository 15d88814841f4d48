package plan

import (
	"fmt"
	"math"
	"sort"
	"strings"
)

// This file is the cluster a plan at scale runs on (hpcrun plan
// --cluster): a node of GPUs joined by NVLink, the network between nodes,
// and what the collectives cost on each path. It is a model for planning
// only: the engine's own collectives are priced in plan.go.

// Node is one machine of a cluster: its GPUs (a Device of the table in
// device.go) and the link between them.
type Node struct {
	GPU  Device `json:"gpu"`
	GPUs int    `json:"gpus"`
	// NVLink is one GPU's bytes/s to the others of its node, each
	// direction (through NVSwitch, or the direct links of a 4-GPU board);
	// NVLinkLatency the cost of one step of a collective over it.
	NVLink        float64 `json:"nvlink_bandwidth"`
	NVLinkLatency float64 `json:"nvlink_latency_s"`
}

// Network is what joins the nodes: Links adapters a node, each of
// LinkBandwidth bytes/s a direction, and the latency of one step of a
// collective (or one point-to-point message) between two nodes.
type Network struct {
	Name          string  `json:"name"`
	Links         int     `json:"links"`
	LinkBandwidth float64 `json:"link_bandwidth"`
	Latency       float64 `json:"latency_s"`
}

// Cluster is a preset of hpcrun plan --cluster: identical nodes on one
// network. Source says where its figures come from.
type Cluster struct {
	Name    string  `json:"name"`
	Node    Node    `json:"node"`
	Net     Network `json:"network"`
	Source  string  `json:"source"`
	Comment string  `json:"comment,omitempty"`
}

// linkEfficiency is the share of a link's nominal bandwidth NCCL's
// collectives reach on large messages: nccl-tests' bus bandwidth on a DGX
// A100 is about 230 of NVLink's 300 GB/s inside a node and about 20 of
// each HDR adapter's 25 GB/s across nodes. One figure for every path.
const linkEfficiency = 0.8

const gbit = 1e9 / 8 // bytes/s of one Gb/s

// clusters are the presets. GPUs are the device table's (device.go);
// the node and network figures are the vendors' and the sites' published
// ones, cited beside each.
// paperCluster is the cluster of Narayanan et al.'s table: a plan on it
// of one of the table's rows is printed beside the paper's figure.
const paperCluster = "dgx-a100-superpod"

var clusters = map[string]Cluster{
	// NVIDIA DGX A100 SuperPOD (the paper's Selene): DGX A100 nodes of 8
	// A100-SXM4-80GB on six NVSwitches, NVLink 3 at 600 GB/s a GPU both
	// directions, and 8 ConnectX-6 HDR InfiniBand adapters (200 Gb/s each)
	// for the compute fabric, one a GPU (NVIDIA DGX A100 User Guide and
	// DGX SuperPOD reference architecture; Narayanan et al. 2021 §5).
	"dgx-a100-superpod": {Name: "dgx-a100-superpod",
		Node:   Node{GPU: devices["a100-80"], GPUs: 8, NVLink: 300e9, NVLinkLatency: 5e-6},
		Net:    Network{Name: "8x HDR InfiniBand 200 Gb/s", Links: 8, LinkBandwidth: 200 * gbit, Latency: 10e-6},
		Source: "NVIDIA DGX A100 datasheet and SuperPOD reference architecture: 8 A100 80GB, NVSwitch 600 GB/s a GPU, 8x HDR 200 Gb/s a node"},
	// IDRIS Jean Zay, V100 partition gpu_p13: 4 V100-SXM2 (16 or 32 GB) a
	// node, each pair joined by 2 NVLink 2 links (150 GB/s a GPU in all,
	// each direction), Intel Omni-Path 100 Gb/s between nodes (IDRIS's
	// hardware description; the link count, one a GPU, is as IDRIS states
	// it for the converged nodes).
	"jean-zay-v100": {Name: "jean-zay-v100",
		Node:   Node{GPU: devices["v100-32"], GPUs: 4, NVLink: 150e9, NVLinkLatency: 6e-6},
		Net:    Network{Name: "Omni-Path 100 Gb/s", Links: 4, LinkBandwidth: 100 * gbit, Latency: 12e-6},
		Source: "IDRIS Jean Zay gpu_p13: 4 V100-SXM2 32 GB a node, NVLink 2, Intel Omni-Path 100 Gb/s"},
	// Jean Zay's octo-V100 nodes (gpu_p2): 8 V100-SXM2 32 GB on NVLink 2
	// (hybrid cube mesh: 6 links, 150 GB/s a GPU each direction),
	// Omni-Path 100 Gb/s.
	"jean-zay-v100-8": {Name: "jean-zay-v100-8",
		Node:   Node{GPU: devices["v100-32"], GPUs: 8, NVLink: 150e9, NVLinkLatency: 6e-6},
		Net:    Network{Name: "Omni-Path 100 Gb/s", Links: 4, LinkBandwidth: 100 * gbit, Latency: 12e-6},
		Source: "IDRIS Jean Zay gpu_p2: 8 V100-SXM2 32 GB a node, NVLink 2, Intel Omni-Path 100 Gb/s"},
	// Jean Zay's A100 partition (gpu_p5): 8 A100-SXM4-80GB on NVSwitch
	// (600 GB/s a GPU both directions), InfiniBand HDR 200 Gb/s.
	"jean-zay-a100": {Name: "jean-zay-a100",
		Node:   Node{GPU: devices["a100-80"], GPUs: 8, NVLink: 300e9, NVLinkLatency: 5e-6},
		Net:    Network{Name: "4x HDR InfiniBand 200 Gb/s", Links: 4, LinkBandwidth: 200 * gbit, Latency: 10e-6},
		Source: "IDRIS Jean Zay gpu_p5: 8 A100-SXM4 80 GB a node, NVSwitch, 4x InfiniBand HDR 200 Gb/s"},
	// Jean Zay's H100 partition (gpu_p6, 2024: 364 nodes, 1456 GPUs): 4
	// H100-SXM5-80GB a node joined directly by NVLink 4 (18 links, 450
	// GB/s a GPU each direction), InfiniBand NDR 400 Gb/s, one a GPU.
	"jean-zay-h100": {Name: "jean-zay-h100",
		Node:   Node{GPU: devices["h100-80"], GPUs: 4, NVLink: 450e9, NVLinkLatency: 4e-6},
		Net:    Network{Name: "4x NDR InfiniBand 400 Gb/s", Links: 4, LinkBandwidth: 400 * gbit, Latency: 8e-6},
		Source: "IDRIS Jean Zay gpu_p6: 4 H100-SXM5 80 GB a node, NVLink 4, 4x InfiniBand NDR 400 Gb/s"},
}

// LookupCluster returns the preset called name (see ClusterNames), its
// GPU with the table's GEMM efficiency.
func LookupCluster(name string) (Cluster, error) {
	c, ok := clusters[strings.ToLower(strings.TrimSpace(name))]
	if !ok {
		return Cluster{}, fmt.Errorf("cluster %q: use one of %s", name, strings.Join(ClusterNames(), ", "))
	}
	c.Node.GPU.Efficiency = gpuEfficiency
	c.Node.GPU.Source = fmt.Sprintf("nominal peak of the table, at %.0f%% for the GEMMs", 100*gpuEfficiency)
	return c, nil
}

// ClusterNames lists the presets, sorted.
func ClusterNames() []string {
	names := make([]string, 0, len(clusters))
	for n := range clusters {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// Path is where a group's collective runs: Ranks ranks, PerNode of them on
// each node the group spans (PerNode >= Ranks: inside one node). Every GPU
// of a node is taken to run such a collective at the same time (the
// data-parallel groups of all tp ranks do), so a rank has its 1/GPUs share
// of the node's adapters.
type Path struct {
	Ranks   int
	PerNode int
}

// nodes is how many nodes the group spans.
func (p Path) nodes() int { return (p.Ranks + p.PerNode - 1) / p.PerNode }

// nvlink is a GPU's achieved bytes/s on NVLink; nic a GPU's share of its
// node's adapters when all the node's GPUs use them at once.
func (c Cluster) nvlink() float64 { return c.Node.NVLink * linkEfficiency }
func (c Cluster) nic() float64 {
	return float64(c.Net.Links) * c.Net.LinkBandwidth * linkEfficiency / float64(c.Node.GPUs)
}

// AllReduce is the seconds an all-reduce of bytes (each rank's whole
// tensor) takes on path p, NCCL's faster of two algorithms:
//
//   - ring: inside a node each rank sends 2(r-1)/r of the tensor over
//     NVLink; across k nodes, after the node's ranks have reduced it among
//     themselves, each rank sends 2(k-1)/k of its 1/g part (g ranks a
//     node) through its share of the adapters. NCCL pipelines the two, so
//     the slower path sets the time; 2(r-1) steps of latency.
//   - tree (across nodes only): the same bandwidth, about 2 log2(k)
//     network steps and 2(g-1) NVLink steps of latency: faster for small
//     tensors on many nodes.
func (c Cluster) AllReduce(bytes float64, p Path) float64 {
	r := p.Ranks
	if r <= 1 || bytes <= 0 {
		return 0
	}
	g := min(p.PerNode, r)
	k := p.nodes()
	intra := 0.0
	if g > 1 {
		intra = 2 * float64(g-1) / float64(g) * bytes / c.nvlink()
	}
	if k == 1 {
		return intra + 2*float64(r-1)*c.Node.NVLinkLatency
	}
	inter := 2 * float64(k-1) / float64(k) * bytes / float64(g) / c.nic()
	bw := math.Max(intra, inter)
	ring := bw + 2*float64(k-1)*c.Net.Latency + 2*float64(r-k)*c.Node.NVLinkLatency
	tree := bw + 2*math.Ceil(math.Log2(float64(k)))*c.Net.Latency + 2*float64(g-1)*c.Node.NVLinkLatency
	return math.Min(ring, tree)
}

// AllGather is the seconds an all-gather of a gathered tensor of bytes
// takes inside a node of r ranks: each sends (r-1)/r of it.
func (c Cluster) AllGather(bytes float64, r int) float64 {
	if r <= 1 {
		return 0
	}
	return float64(r-1)/float64(r)*bytes/c.nvlink() + float64(r-1)*c.Node.NVLinkLatency
}

// Send is the seconds one point-to-point message of bytes takes between
// two pipeline stages' ranks: over NVLink in a node; across nodes through
// the GPU's adapter, and with the paper's scatter/gather (tp > 1) each of
// the tp ranks sends only its 1/tp of the activation, which the receiving
// node all-gathers over NVLink.
func (c Cluster) Send(bytes float64, crossNode bool, tp int) float64 {
	if !crossNode {
		return bytes/c.nvlink() + c.Node.NVLinkLatency
	}
	if tp <= 1 {
		return bytes/c.nic() + c.Net.Latency
	}
	return bytes/float64(tp)/c.nic() + c.Net.Latency + c.AllGather(bytes, tp)
}
