package parallel

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/hpcrun/hpcrun/internal/rankgrid"
	"github.com/hpcrun/hpcrun/nccl"
)

func TestMeshLayout(t *testing.T) {
	for _, tc := range []struct {
		world, tp int
	}{{1, 1}, {4, 1}, {4, 2}, {4, 4}, {8, 2}, {6, 3}} {
		t.Run(fmt.Sprintf("world%d_tp%d", tc.world, tc.tp), func(t *testing.T) {
			err := nccl.RunInProcess(tc.world, func(c nccl.Comm) error {
				m, err := NewMesh(c, tc.tp)
				if err != nil {
					return err
				}
				defer m.Close()
				r := c.Rank()
				if m.TPRank()+m.DPRank()*tc.tp != r {
					return fmt.Errorf("tp rank %d dp rank %d: not rank %d", m.TPRank(), m.DPRank(), r)
				}
				if m.TPSize() != tc.tp || m.DPSize() != tc.world/tc.tp || m.PPSize() != 1 {
					return fmt.Errorf("sizes tp %d dp %d pp %d", m.TPSize(), m.DPSize(), m.PPSize())
				}
				wantTP := make([]int, tc.tp)
				for i := range wantTP {
					wantTP[i] = r/tc.tp*tc.tp + i
				}
				wantDP := make([]int, tc.world/tc.tp)
				for i := range wantDP {
					wantDP[i] = r%tc.tp + i*tc.tp
				}
				if !slices.Equal(m.TPRanks(), wantTP) || !slices.Equal(m.DPRanks(), wantDP) {
					return fmt.Errorf("groups %v %v, want %v %v", m.TPRanks(), m.DPRanks(), wantTP, wantDP)
				}
				if m.TP.Rank() != m.TPRank() || m.TP.Size() != tc.tp || m.DP.Rank() != m.DPRank() {
					return fmt.Errorf("communicators disagree with the grid: %s", m)
				}
				// The groups really are the grid's: a sum over TP adds the
				// global ranks of the TP group, over DP those of the DP group.
				for _, g := range []struct {
					c     nccl.Comm
					ranks []int
				}{{m.TP, wantTP}, {m.DP, wantDP}} {
					buf := []float32{float32(r)}
					if err := g.c.AllReduce(buf, nccl.Sum); err != nil {
						return err
					}
					want := 0
					for _, x := range g.ranks {
						want += x
					}
					if buf[0] != float32(want) {
						return fmt.Errorf("sum over %v is %v, want %d", g.ranks, buf[0], want)
					}
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
		})
	}
}

func TestMeshBadTP(t *testing.T) {
	for _, tp := range []int{0, -1, 3} {
		err := nccl.RunInProcess(4, func(c nccl.Comm) error {
			_, err := NewMesh(c, tp)
			if err == nil {
				return fmt.Errorf("tp %d of 4 ranks: no error", tp)
			}
			if !strings.Contains(err.Error(), "tp") {
				return fmt.Errorf("error %q does not name tp", err)
			}
			return nil
		})
		if err != nil {
			t.Error(err)
		}
	}
}

// fakeSize is the rank-0 communicator of an in-process world of n ranks,
// for constructors that only read Size and Rank.
func fakeSize(t *testing.T, n int) nccl.Comm {
	t.Helper()
	return nccl.NewInProcess(n)[0]
}

// TestMeshPipeline checks the (pp, dp, tp) grid: rank = tp_rank +
// tp*(dp_rank + dp*pp_rank), pipeline groups strided by dp*tp, and the
// embedding group of the first and last stages.
func TestMeshPipeline(t *testing.T) {
	for _, tc := range []struct{ world, pp, tp int }{{2, 2, 1}, {4, 2, 2}, {8, 2, 2}, {6, 3, 1}, {8, 4, 1}} {
		t.Run(fmt.Sprintf("world%d_pp%d_tp%d", tc.world, tc.pp, tc.tp), func(t *testing.T) {
			dp := tc.world / (tc.pp * tc.tp)
			err := nccl.RunInProcess(tc.world, func(c nccl.Comm) error {
				m, err := NewMeshPP(c, tc.pp, tc.tp)
				if err != nil {
					return err
				}
				defer m.Close()
				r := c.Rank()
				if got := m.TPRank() + tc.tp*(m.DPRank()+dp*m.PPRank()); got != r || m.PPSize() != tc.pp || m.DPSize() != dp {
					return fmt.Errorf("rank %d: %s", r, m)
				}
				want := make([]int, tc.pp)
				for p := range want {
					want[p] = r%(dp*tc.tp) + p*dp*tc.tp
				}
				if !slices.Equal(m.PPRanks(), want) || m.PP.Rank() != m.PPRank() {
					return fmt.Errorf("rank %d: pp group %v, want %v", r, m.PPRanks(), want)
				}
				for _, g := range []struct {
					c     nccl.Comm
					ranks []int
				}{{m.PP, want}, {m.TP, m.TPRanks()}, {m.DP, m.DPRanks()}, {m.Embed, []int{want[0], want[tc.pp-1]}}} {
					if g.c == nil {
						if g.ranks[0] == r || g.ranks[len(g.ranks)-1] == r {
							return fmt.Errorf("rank %d: no embedding group", r)
						}
						continue
					}
					buf := []float32{float32(r)}
					if err := g.c.AllReduce(buf, nccl.Sum); err != nil {
						return err
					}
					sum := 0
					for _, x := range g.ranks {
						sum += x
					}
					if buf[0] != float32(sum) {
						return fmt.Errorf("rank %d: sum over %v is %v, want %d", r, g.ranks, buf[0], sum)
					}
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
		})
	}
}

// rankgrid.Of, which the metrics and the dashboard read a rank's position
// with, is the position the Mesh gives the rank, and each of the Mesh's
// groups is the ranks rankgrid places with it.
func TestRankGridIsMesh(t *testing.T) {
	for _, tc := range []struct{ tp, dp, pp int }{{1, 1, 1}, {2, 1, 1}, {1, 4, 1}, {2, 2, 1}, {2, 2, 2}, {1, 2, 3}, {2, 1, 4}, {4, 2, 2}} {
		t.Run(fmt.Sprintf("tp%d_dp%d_pp%d", tc.tp, tc.dp, tc.pp), func(t *testing.T) {
			world := tc.tp * tc.dp * tc.pp
			// group is the ranks whose position agrees with at's but for the
			// varying coordinate, in its order.
			group := func(at rankgrid.Coords, same func(a, b rankgrid.Coords) bool) []int {
				var out []int
				for q := range world {
					if same(rankgrid.Of(q, tc.tp, tc.dp), at) {
						out = append(out, q)
					}
				}
				return out
			}
			err := nccl.RunInProcess(world, func(c nccl.Comm) error {
				m, err := NewMeshPP(c, tc.pp, tc.tp)
				if err != nil {
					return err
				}
				defer m.Close()
				r := c.Rank()
				at := rankgrid.Of(r, tc.tp, tc.dp)
				if want := (rankgrid.Coords{TP: m.TPRank(), DP: m.DPRank(), PP: m.PPRank()}); at != want {
					return fmt.Errorf("rank %d: rankgrid %+v, mesh %+v", r, at, want)
				}
				tpGroup := group(at, func(a, b rankgrid.Coords) bool { return a.DP == b.DP && a.PP == b.PP })
				dpGroup := group(at, func(a, b rankgrid.Coords) bool { return a.TP == b.TP && a.PP == b.PP })
				ppGroup := group(at, func(a, b rankgrid.Coords) bool { return a.TP == b.TP && a.DP == b.DP })
				if !slices.Equal(m.TPRanks(), tpGroup) || !slices.Equal(m.DPRanks(), dpGroup) || !slices.Equal(m.PPRanks(), ppGroup) {
					return fmt.Errorf("rank %d: mesh groups tp %v dp %v pp %v, rankgrid's %v %v %v", r, m.TPRanks(), m.DPRanks(), m.PPRanks(), tpGroup, dpGroup, ppGroup)
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
		})
	}
}
