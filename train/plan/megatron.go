package plan

// This file holds the published results a plan at scale is checked
// against: the weak-scaling table of Narayanan et al., "Efficient
// Large-Scale Language Model Training on GPU Clusters Using Megatron-LM"
// (SC '21, arXiv:2104.04473), Table 1. testdata/megatron_sc21_table1.csv
// holds the same rows with the citation; TestMegatronTable checks the two
// agree and sets the plan's predictions beside them.

// PaperRow is one row of the table: a GPT model (vocabulary 51,200,
// sequence 2048), its layout on DGX A100 80GB nodes, and what it reached,
// with mixed precision, full activation recomputation and the interleaved
// 1F1B schedule where pp > 1.
type PaperRow struct {
	ParamsB     float64 `json:"params_b"` // billions of parameters
	Heads       int     `json:"heads"`
	Dim         int     `json:"dim"`
	Layers      int     `json:"layers"`
	TP          int     `json:"tp"`
	PP          int     `json:"pp"`
	GPUs        int     `json:"gpus"`
	GlobalBatch int     `json:"global_batch"`
	TFLOPs      float64 `json:"tflops_per_gpu"` // achieved teraFLOP/s a GPU
	PeakPct     float64 `json:"peak_pct"`       // % of the A100's 312 TFLOP/s
	PFLOPs      float64 `json:"pflops"`         // aggregate petaFLOP/s
}

// The table's fixed shape: every row is a GPT of this vocabulary and
// sequence.
const (
	PaperVocab = 51200
	PaperSeq   = 2048
)

// PaperTable is Table 1 of Narayanan et al. 2021. Verified against stored
// copies: heads, dim and layers of the rows up to 310.1B (two Megatron
// example READMEs citing the table), and layers, dim, tp, pp, GPUs and
// TFLOP/s of the 1.7B, 18.4B, 145.6B, 529.6B and 1T rows (a summary of the
// paper); the others as transcribed from the paper.
var PaperTable = []PaperRow{
	{1.7, 24, 2304, 24, 1, 1, 32, 512, 137, 44, 4.4},
	{3.6, 32, 3072, 30, 2, 1, 64, 512, 138, 44, 8.8},
	{7.5, 32, 4096, 36, 4, 1, 128, 512, 142, 46, 18.2},
	{18.4, 48, 6144, 40, 8, 1, 256, 1024, 135, 43, 34.6},
	{39.1, 64, 8192, 48, 8, 2, 512, 1536, 138, 44, 70.8},
	{76.1, 80, 10240, 60, 8, 4, 1024, 1792, 140, 45, 143.8},
	{145.6, 96, 12288, 80, 8, 8, 1536, 2304, 148, 47, 227.1},
	{310.1, 128, 16384, 96, 8, 16, 1920, 2160, 155, 50, 297.4},
	{529.6, 128, 20480, 105, 8, 35, 2520, 2520, 163, 52, 410.2},
	{1008.0, 160, 25600, 128, 8, 64, 3072, 3072, 163, 52, 502.0},
}

// PaperFlops is the paper's count of the FLOPs of one iteration (§5.1,
// with activation recomputation: one forward more): 96 B s l h^2 (1 +
// s/(6h) + V/(16 l h)) for a global batch of B sequences of s tokens, l
// layers of width h and a vocabulary of V. It serves only to set a plan
// at scale beside the paper's table (Scale.TFLOPs); MFU and HFU count
// spec.ModelFlopsPerToken and spec.HardwareFlopsPerToken, which add
// the biases, norms and position table the paper leaves out.
func PaperFlops(batch, seq, layers, dim, vocab int) float64 {
	B, s, l, h, V := float64(batch), float64(seq), float64(layers), float64(dim), float64(vocab)
	return 96 * B * s * l * h * h * (1 + s/(6*h) + V/(16*l*h))
}

// FindPaperRow is the table's row of a GPT of this shape on this many
// GPUs, if there is one.
func FindPaperRow(layers, dim, heads, seq, vocab, gpus int) (PaperRow, bool) {
	if seq != PaperSeq || vocab != PaperVocab {
		return PaperRow{}, false
	}
	for _, r := range PaperTable {
		if r.Layers == layers && r.Dim == dim && r.Heads == heads && r.GPUs == gpus {
			return r, true
		}
	}
	return PaperRow{}, false
}
