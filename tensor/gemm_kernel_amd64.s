//go:build !noasm

#include "textflag.h"

// Micro-kernels for the packed GEMM driver (gemm_driver.go). Each computes one
// (MR,NR) tile of row-major C from an MR-row micro-panel of A (for each k
// step, MR values of one column of A, contiguous) and an NR-column
// micro-panel of B (for each k step, NR values of one row of B, contiguous):
//
//	C = alpha*Ap*Bp + beta*C   when loadC != 0
//	C = alpha*Ap*Bp            when loadC == 0 (C is not read)
//
// k >= 1. ldc is in elements. Accumulators stay in registers for the whole k
// loop; only the final tile touches C.

// func sgemmKernel12x32AVX512(k int, a, b, c *float32, ldc int, alpha, beta float32, loadC int)
//
// 24 zmm accumulators (12 rows x 2 vectors of 16), B rows in Z24/Z25, the A
// value folded into each FMA as an embedded broadcast.
TEXT ·sgemmKernel12x32AVX512(SB), NOSPLIT, $0-56
	MOVQ k+0(FP), CX
	MOVQ a+8(FP), AX
	MOVQ b+16(FP), BX
	MOVQ c+24(FP), DI
	MOVQ ldc+32(FP), DX
	SHLQ $2, DX

	// Start fetching the C tile now; it is needed only after the k loop.
	MOVQ DI, R10
	MOVQ $12, R11

prefetchc512:
	PREFETCHT0 (R10)
	PREFETCHT0 64(R10)
	ADDQ DX, R10
	DECQ R11
	JNZ  prefetchc512

	VPXORD Z0, Z0, Z0
	VPXORD Z1, Z1, Z1
	VPXORD Z2, Z2, Z2
	VPXORD Z3, Z3, Z3
	VPXORD Z4, Z4, Z4
	VPXORD Z5, Z5, Z5
	VPXORD Z6, Z6, Z6
	VPXORD Z7, Z7, Z7
	VPXORD Z8, Z8, Z8
	VPXORD Z9, Z9, Z9
	VPXORD Z10, Z10, Z10
	VPXORD Z11, Z11, Z11
	VPXORD Z12, Z12, Z12
	VPXORD Z13, Z13, Z13
	VPXORD Z14, Z14, Z14
	VPXORD Z15, Z15, Z15
	VPXORD Z16, Z16, Z16
	VPXORD Z17, Z17, Z17
	VPXORD Z18, Z18, Z18
	VPXORD Z19, Z19, Z19
	VPXORD Z20, Z20, Z20
	VPXORD Z21, Z21, Z21
	VPXORD Z22, Z22, Z22
	VPXORD Z23, Z23, Z23

// STEP512 is one k step: A column at offset ao(AX), B row at bo(BX).
#define STEP512(ao, bo) \
	VMOVUPS bo(BX), Z24; \
	VMOVUPS (bo+64)(BX), Z25; \
	VFMADD231PS.BCST (ao+0)(AX), Z24, Z0; \
	VFMADD231PS.BCST (ao+0)(AX), Z25, Z1; \
	VFMADD231PS.BCST (ao+4)(AX), Z24, Z2; \
	VFMADD231PS.BCST (ao+4)(AX), Z25, Z3; \
	VFMADD231PS.BCST (ao+8)(AX), Z24, Z4; \
	VFMADD231PS.BCST (ao+8)(AX), Z25, Z5; \
	VFMADD231PS.BCST (ao+12)(AX), Z24, Z6; \
	VFMADD231PS.BCST (ao+12)(AX), Z25, Z7; \
	VFMADD231PS.BCST (ao+16)(AX), Z24, Z8; \
	VFMADD231PS.BCST (ao+16)(AX), Z25, Z9; \
	VFMADD231PS.BCST (ao+20)(AX), Z24, Z10; \
	VFMADD231PS.BCST (ao+20)(AX), Z25, Z11; \
	VFMADD231PS.BCST (ao+24)(AX), Z24, Z12; \
	VFMADD231PS.BCST (ao+24)(AX), Z25, Z13; \
	VFMADD231PS.BCST (ao+28)(AX), Z24, Z14; \
	VFMADD231PS.BCST (ao+28)(AX), Z25, Z15; \
	VFMADD231PS.BCST (ao+32)(AX), Z24, Z16; \
	VFMADD231PS.BCST (ao+32)(AX), Z25, Z17; \
	VFMADD231PS.BCST (ao+36)(AX), Z24, Z18; \
	VFMADD231PS.BCST (ao+36)(AX), Z25, Z19; \
	VFMADD231PS.BCST (ao+40)(AX), Z24, Z20; \
	VFMADD231PS.BCST (ao+40)(AX), Z25, Z21; \
	VFMADD231PS.BCST (ao+44)(AX), Z24, Z22; \
	VFMADD231PS.BCST (ao+44)(AX), Z25, Z23

	// Unrolled by 4 k steps; the remainder runs one step at a time.
	MOVQ CX, R8
	SHRQ $2, R8
	ANDQ $3, CX
	TESTQ R8, R8
	JZ   tail512

loop512:
	PREFETCHT0 512(BX)
	STEP512(0, 0)
	PREFETCHT0 640(BX)
	STEP512(48, 128)
	PREFETCHT0 768(BX)
	STEP512(96, 256)
	PREFETCHT0 896(BX)
	STEP512(144, 384)
	ADDQ $192, AX
	ADDQ $512, BX
	DECQ R8
	JNZ  loop512

tail512:
	TESTQ CX, CX
	JZ    store512

tailloop512:
	STEP512(0, 0)
	ADDQ $48, AX
	ADDQ $128, BX
	DECQ CX
	JNZ  tailloop512

store512:
	VBROADCASTSS alpha+40(FP), Z24
	VBROADCASTSS beta+44(FP), Z25
	MOVQ loadC+48(FP), R9
	TESTQ R9, R9
	JZ   overwrite512

// ROWBETA512 stores row r of the tile: C = alpha*acc + beta*C.
#define ROWBETA512(z0, z1) \
	VMULPS Z24, z0, z0; \
	VMULPS Z24, z1, z1; \
	VFMADD231PS (DI), Z25, z0; \
	VFMADD231PS 64(DI), Z25, z1; \
	VMOVUPS z0, (DI); \
	VMOVUPS z1, 64(DI); \
	ADDQ DX, DI

	ROWBETA512(Z0, Z1)
	ROWBETA512(Z2, Z3)
	ROWBETA512(Z4, Z5)
	ROWBETA512(Z6, Z7)
	ROWBETA512(Z8, Z9)
	ROWBETA512(Z10, Z11)
	ROWBETA512(Z12, Z13)
	ROWBETA512(Z14, Z15)
	ROWBETA512(Z16, Z17)
	ROWBETA512(Z18, Z19)
	ROWBETA512(Z20, Z21)
	ROWBETA512(Z22, Z23)
	VZEROUPPER
	RET

// ROW512 stores row r of the tile: C = alpha*acc.
#define ROW512(z0, z1) \
	VMULPS Z24, z0, z0; \
	VMULPS Z24, z1, z1; \
	VMOVUPS z0, (DI); \
	VMOVUPS z1, 64(DI); \
	ADDQ DX, DI

overwrite512:
	ROW512(Z0, Z1)
	ROW512(Z2, Z3)
	ROW512(Z4, Z5)
	ROW512(Z6, Z7)
	ROW512(Z8, Z9)
	ROW512(Z10, Z11)
	ROW512(Z12, Z13)
	ROW512(Z14, Z15)
	ROW512(Z16, Z17)
	ROW512(Z18, Z19)
	ROW512(Z20, Z21)
	ROW512(Z22, Z23)
	VZEROUPPER
	RET

// func sgemmKernel6x16AVX2(k int, a, b, c *float32, ldc int, alpha, beta float32, loadC int)
//
// 12 ymm accumulators (6 rows x 2 vectors of 8), B rows in Y12/Y13, A values
// broadcast into Y14/Y15 alternately.
TEXT ·sgemmKernel6x16AVX2(SB), NOSPLIT, $0-56
	MOVQ k+0(FP), CX
	MOVQ a+8(FP), AX
	MOVQ b+16(FP), BX
	MOVQ c+24(FP), DI
	MOVQ ldc+32(FP), DX
	SHLQ $2, DX

	VXORPS Y0, Y0, Y0
	VXORPS Y1, Y1, Y1
	VXORPS Y2, Y2, Y2
	VXORPS Y3, Y3, Y3
	VXORPS Y4, Y4, Y4
	VXORPS Y5, Y5, Y5
	VXORPS Y6, Y6, Y6
	VXORPS Y7, Y7, Y7
	VXORPS Y8, Y8, Y8
	VXORPS Y9, Y9, Y9
	VXORPS Y10, Y10, Y10
	VXORPS Y11, Y11, Y11

#define STEP256(ao, bo) \
	VMOVUPS bo(BX), Y12; \
	VMOVUPS (bo+32)(BX), Y13; \
	VBROADCASTSS (ao+0)(AX), Y14; \
	VFMADD231PS Y14, Y12, Y0; \
	VFMADD231PS Y14, Y13, Y1; \
	VBROADCASTSS (ao+4)(AX), Y15; \
	VFMADD231PS Y15, Y12, Y2; \
	VFMADD231PS Y15, Y13, Y3; \
	VBROADCASTSS (ao+8)(AX), Y14; \
	VFMADD231PS Y14, Y12, Y4; \
	VFMADD231PS Y14, Y13, Y5; \
	VBROADCASTSS (ao+12)(AX), Y15; \
	VFMADD231PS Y15, Y12, Y6; \
	VFMADD231PS Y15, Y13, Y7; \
	VBROADCASTSS (ao+16)(AX), Y14; \
	VFMADD231PS Y14, Y12, Y8; \
	VFMADD231PS Y14, Y13, Y9; \
	VBROADCASTSS (ao+20)(AX), Y15; \
	VFMADD231PS Y15, Y12, Y10; \
	VFMADD231PS Y15, Y13, Y11

	MOVQ CX, R8
	SHRQ $2, R8
	ANDQ $3, CX
	TESTQ R8, R8
	JZ   tail256

loop256:
	PREFETCHT0 256(BX)
	STEP256(0, 0)
	STEP256(24, 64)
	PREFETCHT0 384(BX)
	STEP256(48, 128)
	STEP256(72, 192)
	ADDQ $96, AX
	ADDQ $256, BX
	DECQ R8
	JNZ  loop256

tail256:
	TESTQ CX, CX
	JZ    store256

tailloop256:
	STEP256(0, 0)
	ADDQ $24, AX
	ADDQ $64, BX
	DECQ CX
	JNZ  tailloop256

store256:
	VBROADCASTSS alpha+40(FP), Y12
	VBROADCASTSS beta+44(FP), Y13
	MOVQ loadC+48(FP), R9
	TESTQ R9, R9
	JZ   overwrite256

#define ROWBETA256(y0, y1) \
	VMULPS Y12, y0, y0; \
	VMULPS Y12, y1, y1; \
	VFMADD231PS (DI), Y13, y0; \
	VFMADD231PS 32(DI), Y13, y1; \
	VMOVUPS y0, (DI); \
	VMOVUPS y1, 32(DI); \
	ADDQ DX, DI

	ROWBETA256(Y0, Y1)
	ROWBETA256(Y2, Y3)
	ROWBETA256(Y4, Y5)
	ROWBETA256(Y6, Y7)
	ROWBETA256(Y8, Y9)
	ROWBETA256(Y10, Y11)
	VZEROUPPER
	RET

#define ROW256(y0, y1) \
	VMULPS Y12, y0, y0; \
	VMULPS Y12, y1, y1; \
	VMOVUPS y0, (DI); \
	VMOVUPS y1, 32(DI); \
	ADDQ DX, DI

overwrite256:
	ROW256(Y0, Y1)
	ROW256(Y2, Y3)
	ROW256(Y4, Y5)
	ROW256(Y6, Y7)
	ROW256(Y8, Y9)
	ROW256(Y10, Y11)
	VZEROUPPER
	RET

// func cpuid(eaxArg, ecxArg uint32) (eax, ebx, ecx, edx uint32)
TEXT ·cpuid(SB), NOSPLIT, $0-24
	MOVL eaxArg+0(FP), AX
	MOVL ecxArg+4(FP), CX
	CPUID
	MOVL AX, eax+8(FP)
	MOVL BX, ebx+12(FP)
	MOVL CX, ecx+16(FP)
	MOVL DX, edx+20(FP)
	RET

// func xgetbv() (eax, edx uint32)
TEXT ·xgetbv(SB), NOSPLIT, $0-8
	MOVL $0, CX
	XGETBV
	MOVL AX, eax+0(FP)
	MOVL DX, edx+4(FP)
	RET

// iota16 is 0..15 as int32, the lane numbers of a zmm register.
DATA iota16<>+0(SB)/4, $0
DATA iota16<>+4(SB)/4, $1
DATA iota16<>+8(SB)/4, $2
DATA iota16<>+12(SB)/4, $3
DATA iota16<>+16(SB)/4, $4
DATA iota16<>+20(SB)/4, $5
DATA iota16<>+24(SB)/4, $6
DATA iota16<>+28(SB)/4, $7
DATA iota16<>+32(SB)/4, $8
DATA iota16<>+36(SB)/4, $9
DATA iota16<>+40(SB)/4, $10
DATA iota16<>+44(SB)/4, $11
DATA iota16<>+48(SB)/4, $12
DATA iota16<>+52(SB)/4, $13
DATA iota16<>+56(SB)/4, $14
DATA iota16<>+60(SB)/4, $15
GLOBL iota16<>(SB), RODATA|NOPTR, $64

// func packTransAVX512(dst, src *float32, rows, srcStride, kc, dstStep int)
//
//	for r in [0,rows), p in [0,kc): dst[p*dstStep+r] = src[r*srcStride+p]
//
// Packs rows of the source into k-major panels: 16 k steps of one row are
// loaded as one vector and scattered dstStep elements apart. rows >= 1.
TEXT ·packTransAVX512(SB), NOSPLIT, $0-48
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ rows+16(FP), BX
	MOVQ srcStride+24(FP), R8
	SHLQ $2, R8
	MOVQ kc+32(FP), R9
	MOVQ dstStep+40(FP), DX

	// Z31 = lane*dstStep, the scatter indices; R10 = bytes that 16 k steps
	// advance in dst.
	VPBROADCASTD DX, Z30
	VPMULLD iota16<>(SB), Z30, Z31
	MOVQ DX, R10
	SHLQ $6, R10

	// R11 = kc/16 full blocks; R12 = mask of the kc%16 tail lanes.
	MOVQ R9, R11
	SHRQ $4, R11
	ANDQ $15, R9
	MOVQ R9, CX
	MOVQ $1, R12
	SHLQ CX, R12
	DECQ R12

packrow:
	MOVQ SI, AX
	MOVQ DI, DX
	MOVQ R11, CX
	TESTQ CX, CX
	JZ   packtail

packblock:
	VMOVUPS (AX), Z0
	KXNORW K0, K0, K1
	VSCATTERDPS Z0, K1, (DX)(Z31*4)
	ADDQ $64, AX
	ADDQ R10, DX
	DECQ CX
	JNZ  packblock

packtail:
	TESTQ R9, R9
	JZ    packnext
	KMOVW R12, K1
	VMOVUPS.Z (AX), K1, Z0
	KMOVW R12, K1
	VSCATTERDPS Z0, K1, (DX)(Z31*4)

packnext:
	ADDQ R8, SI
	ADDQ $4, DI
	DECQ BX
	JNZ  packrow
	VZEROUPPER
	RET
