package cuda

import (
	"bytes"
	"debug/elf"
	"encoding/binary"
	"fmt"
	"os"
	"strings"
	"testing"
)

// A CUBIN is an ELF file whose .nv.info section holds per-kernel
// attributes, each a record: format byte, attribute byte, then a 16-bit
// value, or for the "sized" format a 16-bit length and that many bytes.
// EIATTR_REGCOUNT is sized: the kernel's symbol index and its registers
// per thread. Reading it needs no driver, so a machine without a GPU can
// check that every kernel fits its largest launch.
const (
	eifmtSVAL       = 0x04 // sized value
	eiattrRegCount  = 0x2f // EIATTR_REGCOUNT: symbol index, registers
	eiattrMaxThread = 0x05 // EIATTR_MAX_THREADS: __launch_bounds__ (x, y, z)

	regsPerBlock = 65536 // registers a block may use on sm_70 through sm_90
)

// kernelInfo is what a CUBIN says of one kernel.
type kernelInfo struct {
	Registers  int // per thread
	MaxThreads int // from __launch_bounds__; 0 without
}

// cubinKernels reads the register count (and launch bounds) of every
// kernel of a CUBIN.
func cubinKernels(image []byte) (map[string]kernelInfo, error) {
	// A CUBIN's e_version holds NVIDIA's own number, which debug/elf
	// refuses: read a copy that says EV_CURRENT.
	if len(image) < 24 {
		return nil, fmt.Errorf("cubin: %d bytes is no ELF file", len(image))
	}
	image = bytes.Clone(image)
	binary.LittleEndian.PutUint32(image[20:], uint32(elf.EV_CURRENT))
	f, err := elf.NewFile(bytes.NewReader(image))
	if err != nil {
		return nil, fmt.Errorf("cubin: %w", err)
	}
	syms, err := f.Symbols()
	if err != nil {
		return nil, fmt.Errorf("cubin symbols: %w", err)
	}
	symName := func(idx uint32) string {
		if idx == 0 || int(idx) > len(syms) {
			return ""
		}
		return syms[idx-1].Name // Symbols omits the null symbol 0
	}
	out := map[string]kernelInfo{}
	for _, s := range f.Sections {
		if s.Name != ".nv.info" && !strings.HasPrefix(s.Name, ".nv.info.") {
			continue
		}
		data, err := s.Data()
		if err != nil {
			return nil, fmt.Errorf("cubin %s: %w", s.Name, err)
		}
		err = eachAttr(data, func(attr byte, val []byte) {
			switch {
			case attr == eiattrRegCount && len(val) >= 8:
				name := symName(binary.LittleEndian.Uint32(val))
				k := out[name]
				k.Registers = int(binary.LittleEndian.Uint32(val[4:]))
				out[name] = k
			case attr == eiattrMaxThread && len(val) >= 12 && strings.HasPrefix(s.Name, ".nv.info."):
				name := strings.TrimPrefix(s.Name, ".nv.info.")
				k := out[name]
				k.MaxThreads = int(binary.LittleEndian.Uint32(val)) * int(binary.LittleEndian.Uint32(val[4:])) * int(binary.LittleEndian.Uint32(val[8:]))
				out[name] = k
			}
		})
		if err != nil {
			return nil, fmt.Errorf("cubin %s: %w", s.Name, err)
		}
	}
	// Where .nv.info has no register count, the kernel's .text section
	// may carry it in the top byte of sh_info (CUBINs for sm_70 do, for
	// sm_90 not).
	for _, s := range f.Sections {
		name, ok := strings.CutPrefix(s.Name, ".text.")
		if k := out[name]; ok && name != "" && k.Registers == 0 && s.Info>>24 != 0 {
			k.Registers = int(s.Info >> 24)
			out[name] = k
		}
	}
	delete(out, "")
	return out, nil
}

// eachAttr walks the records of an .nv.info section, passing the sized
// ones' bytes to fn.
func eachAttr(data []byte, fn func(attr byte, val []byte)) error {
	for off := 0; off < len(data); {
		if off+4 > len(data) {
			return fmt.Errorf("truncated record at byte %d", off)
		}
		format, attr := data[off], data[off+1]
		v := int(binary.LittleEndian.Uint16(data[off+2:]))
		off += 4
		if format != eifmtSVAL {
			continue
		}
		if off+v > len(data) {
			return fmt.Errorf("record 0x%02x at byte %d runs past the section", attr, off-4)
		}
		fn(attr, data[off:off+v])
		off += v
	}
	return nil
}

// checkLaunchLimits fails when a kernel of the image needs more registers
// per block at its largest launch (kernels' maxThreads) than a block may
// have, or is missing from the image.
func checkLaunchLimits(image []byte, arch string) error {
	return checkLaunches(image, arch, kernels)
}

// checkLaunches is checkLaunchLimits against a given table.
func checkLaunches(image []byte, arch string, table []struct {
	name       string
	maxThreads int
}) error {
	info, err := cubinKernels(image)
	if err != nil {
		return err
	}
	var bad []string
	for _, k := range table {
		ki, ok := info[k.name]
		if !ok {
			bad = append(bad, k.name+" is missing")
			continue
		}
		if ki.Registers*k.maxThreads > regsPerBlock {
			bad = append(bad, fmt.Sprintf("%s uses %d registers a thread: %d threads need %d, more than %d",
				k.name, ki.Registers, k.maxThreads, ki.Registers*k.maxThreads, regsPerBlock))
		}
	}
	if len(bad) > 0 {
		return fmt.Errorf("kernels compiled for %s: %s", arch, strings.Join(bad, "; "))
	}
	return nil
}

// RequireNVRTCEnv, when set (CI sets it), makes the NVRTC compile test fail
// instead of skipping where NVRTC does not load.
const requireNVRTCEnv = "HPCRUN_REQUIRE_NVRTC"

// TestNVRTCCompilesKernels compiles kernels.cu through the device's own
// NVRTC code for V100, A100 and H100 (no driver or GPU needed) and checks
// that every kernel's registers allow its largest launch. The archs the
// loaded NVRTC does not compile (sm_90 before CUDA 11.8, sm_70 from CUDA
// 13 on) are skipped, saying why; every arch it lists must compile.
func TestNVRTCCompilesKernels(t *testing.T) {
	l := &libs{}
	if err := l.nvrtc.open(0, nil); err != nil {
		if os.Getenv(requireNVRTCEnv) != "" {
			t.Fatalf("%s is set but NVRTC does not load: %v", requireNVRTCEnv, err)
		}
		t.Skipf("no NVRTC here (Debian: apt install libnvrtc11.2 from non-free; set %s=1 to make this a failure): %v", requireNVRTCEnv, err)
	}
	t.Logf("%s: NVRTC %d.%d compiles %v", l.nvrtc.name, l.nvrtc.major, l.nvrtc.minor, l.nvrtc.archs())
	archs, skipped := splitArchs(l.nvrtc.name, []string{"sm_70", "sm_80", "sm_90"}, l.nvrtc.archs())
	for _, err := range skipped {
		t.Logf("skipped: %v", err)
	}
	if len(archs) == 0 {
		t.Fatalf("NVRTC %d.%d compiles none of sm_70, sm_80, sm_90", l.nvrtc.major, l.nvrtc.minor)
	}
	for _, arch := range archs {
		image, err := l.compileNVRTC(kernelSource, "hpcrun_kernels.cu", arch)
		if err != nil {
			t.Fatalf("%s: %v", arch, err)
		}
		info, err := cubinKernels(image)
		if err != nil {
			t.Fatalf("%s: %v", arch, err)
		}
		if err := checkLaunchLimits(image, arch); err != nil {
			t.Error(err)
		}
		for _, k := range kernels {
			if info[k.name].Registers == 0 {
				t.Errorf("%s: the CUBIN of NVRTC %d.%d has no EIATTR_REGCOUNT for %s: its .nv.info layout changed, so this check reads nothing (Open still asks the driver, cuFuncGetAttribute)",
					arch, l.nvrtc.major, l.nvrtc.minor, k.name)
			}
		}
		most := ""
		for _, k := range kernels {
			ki := info[k.name]
			if k.maxThreads > 256 && ki.MaxThreads != k.maxThreads {
				t.Errorf("%s: %s launches %d threads but its launch bounds say %d", arch, k.name, k.maxThreads, ki.MaxThreads)
			}
			if most == "" || ki.Registers > info[most].Registers {
				most = k.name
			}
		}
		t.Logf("%s: %d kernels, %d bytes; most registers: %s (%d)", arch, len(info), len(image), most, info[most].Registers)
		// The check bites: at 4096 threads a block (past the 64K
		// registers of any block), the busiest kernel does not fit.
		over := append(kernels[:0:0], kernels...)
		for i := range over {
			if over[i].name == most {
				over[i].maxThreads = 4096
			}
		}
		if err := checkLaunches(image, arch, over); err == nil || !strings.Contains(err.Error(), most) {
			t.Errorf("%s: %s at 4096 threads passes the register check: %v", arch, most, err)
		}
	}
}
