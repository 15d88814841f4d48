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

// func sgemmKernel4x32AVX512(k int, a, b, c *float32, ldc int, alpha, beta float32, loadC, rows int)
//
// The first rows (1 <= rows <= 4) of the 12x32 kernel's tile, from the same
// 12-row packed A panels: the last panel of an m that is not a multiple of 12
// computes and stores only the rows that exist.
TEXT ·sgemmKernel4x32AVX512(SB), NOSPLIT, $0-64
	MOVQ k+0(FP), CX
	MOVQ a+8(FP), AX
	MOVQ b+16(FP), BX
	MOVQ c+24(FP), DI
	MOVQ ldc+32(FP), DX
	SHLQ $2, DX
	VPXORD Z0, Z0, Z0
	VPXORD Z1, Z1, Z1
	VPXORD Z2, Z2, Z2
	VPXORD Z3, Z3, Z3
	VPXORD Z4, Z4, Z4
	VPXORD Z5, Z5, Z5
	VPXORD Z6, Z6, Z6
	VPXORD Z7, Z7, Z7

k4loop:
	VMOVUPS (BX), Z24
	VMOVUPS 64(BX), Z25
	VFMADD231PS.BCST 0(AX), Z24, Z0
	VFMADD231PS.BCST 0(AX), Z25, Z1
	VFMADD231PS.BCST 4(AX), Z24, Z2
	VFMADD231PS.BCST 4(AX), Z25, Z3
	VFMADD231PS.BCST 8(AX), Z24, Z4
	VFMADD231PS.BCST 8(AX), Z25, Z5
	VFMADD231PS.BCST 12(AX), Z24, Z6
	VFMADD231PS.BCST 12(AX), Z25, Z7
	ADDQ $48, AX
	ADDQ $128, BX
	DECQ CX
	JNZ  k4loop

	VBROADCASTSS alpha+40(FP), Z24
	VBROADCASTSS beta+44(FP), Z25
	MOVQ loadC+48(FP), R9
	MOVQ rows+56(FP), R10
	TESTQ R9, R9
	JZ   k4overwrite
	ROWBETA512(Z0, Z1)
	CMPQ R10, $1
	JLE  k4done
	ROWBETA512(Z2, Z3)
	CMPQ R10, $2
	JLE  k4done
	ROWBETA512(Z4, Z5)
	CMPQ R10, $3
	JLE  k4done
	ROWBETA512(Z6, Z7)
	VZEROUPPER
	RET

k4overwrite:
	ROW512(Z0, Z1)
	CMPQ R10, $1
	JLE  k4done
	ROW512(Z2, Z3)
	CMPQ R10, $2
	JLE  k4done
	ROW512(Z4, Z5)
	CMPQ R10, $3
	JLE  k4done
	ROW512(Z6, Z7)

k4done:
	VZEROUPPER
	RET

// func sgemmKernel8x32AVX512(k int, a, b, c *float32, ldc int, alpha, beta float32, loadC, rows int)
//
// The first rows (1 <= rows <= 8) of the 12x32 kernel's tile, from the same
// 12-row packed A panels: the last panel of an m that is not a multiple of 12
// computes and stores only the rows that exist.
TEXT ·sgemmKernel8x32AVX512(SB), NOSPLIT, $0-64
	MOVQ k+0(FP), CX
	MOVQ a+8(FP), AX
	MOVQ b+16(FP), BX
	MOVQ c+24(FP), DI
	MOVQ ldc+32(FP), DX
	SHLQ $2, DX
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

k8loop:
	VMOVUPS (BX), Z24
	VMOVUPS 64(BX), Z25
	VFMADD231PS.BCST 0(AX), Z24, Z0
	VFMADD231PS.BCST 0(AX), Z25, Z1
	VFMADD231PS.BCST 4(AX), Z24, Z2
	VFMADD231PS.BCST 4(AX), Z25, Z3
	VFMADD231PS.BCST 8(AX), Z24, Z4
	VFMADD231PS.BCST 8(AX), Z25, Z5
	VFMADD231PS.BCST 12(AX), Z24, Z6
	VFMADD231PS.BCST 12(AX), Z25, Z7
	VFMADD231PS.BCST 16(AX), Z24, Z8
	VFMADD231PS.BCST 16(AX), Z25, Z9
	VFMADD231PS.BCST 20(AX), Z24, Z10
	VFMADD231PS.BCST 20(AX), Z25, Z11
	VFMADD231PS.BCST 24(AX), Z24, Z12
	VFMADD231PS.BCST 24(AX), Z25, Z13
	VFMADD231PS.BCST 28(AX), Z24, Z14
	VFMADD231PS.BCST 28(AX), Z25, Z15
	ADDQ $48, AX
	ADDQ $128, BX
	DECQ CX
	JNZ  k8loop

	VBROADCASTSS alpha+40(FP), Z24
	VBROADCASTSS beta+44(FP), Z25
	MOVQ loadC+48(FP), R9
	MOVQ rows+56(FP), R10
	TESTQ R9, R9
	JZ   k8overwrite
	ROWBETA512(Z0, Z1)
	CMPQ R10, $1
	JLE  k8done
	ROWBETA512(Z2, Z3)
	CMPQ R10, $2
	JLE  k8done
	ROWBETA512(Z4, Z5)
	CMPQ R10, $3
	JLE  k8done
	ROWBETA512(Z6, Z7)
	CMPQ R10, $4
	JLE  k8done
	ROWBETA512(Z8, Z9)
	CMPQ R10, $5
	JLE  k8done
	ROWBETA512(Z10, Z11)
	CMPQ R10, $6
	JLE  k8done
	ROWBETA512(Z12, Z13)
	CMPQ R10, $7
	JLE  k8done
	ROWBETA512(Z14, Z15)
	VZEROUPPER
	RET

k8overwrite:
	ROW512(Z0, Z1)
	CMPQ R10, $1
	JLE  k8done
	ROW512(Z2, Z3)
	CMPQ R10, $2
	JLE  k8done
	ROW512(Z4, Z5)
	CMPQ R10, $3
	JLE  k8done
	ROW512(Z6, Z7)
	CMPQ R10, $4
	JLE  k8done
	ROW512(Z8, Z9)
	CMPQ R10, $5
	JLE  k8done
	ROW512(Z10, Z11)
	CMPQ R10, $6
	JLE  k8done
	ROW512(Z12, Z13)
	CMPQ R10, $7
	JLE  k8done
	ROW512(Z14, Z15)

k8done:
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

// The transposing packer, for float32 and (widened as it loads) bfloat16
// sources: PACKTRANS16 is its body once its arguments are in registers (DI
// dst, SI src, BX rows, R8 the source's row stride in bytes, R9 kc, DX
// dstStep), LD the load of one source row's 16 elements into a vector of
// float32 (masked), BLOCKBYTES the bytes of 16 source elements. In the
// body K2 is the rows lanes stored, R11 the kc/16 full blocks, R9 kc%16.
#define LD_F32(m, k, z) VMOVUPS.Z m, k, z
#define LD_BF16(m, k, z) VPMOVZXWD.Z m, k, z; VPSLLD $16, z, z

// PT_LOAD16 loads 16 k steps of rows 0..15 from SI into Z0..Z15 (rows
// past the last repeat it; their lanes are never stored).
#define PT_LOAD16(LD) \
	MOVQ SI, R10; \
	LD((R10), K1, Z0); \
	LEAQ (R10)(R8*1), R13; \
	CMPQ BX, $2; \
	CMOVQGE R13, R10; \
	LD((R10), K1, Z1); \
	LEAQ (R10)(R8*1), R13; \
	CMPQ BX, $3; \
	CMOVQGE R13, R10; \
	LD((R10), K1, Z2); \
	LEAQ (R10)(R8*1), R13; \
	CMPQ BX, $4; \
	CMOVQGE R13, R10; \
	LD((R10), K1, Z3); \
	LEAQ (R10)(R8*1), R13; \
	CMPQ BX, $5; \
	CMOVQGE R13, R10; \
	LD((R10), K1, Z4); \
	LEAQ (R10)(R8*1), R13; \
	CMPQ BX, $6; \
	CMOVQGE R13, R10; \
	LD((R10), K1, Z5); \
	LEAQ (R10)(R8*1), R13; \
	CMPQ BX, $7; \
	CMOVQGE R13, R10; \
	LD((R10), K1, Z6); \
	LEAQ (R10)(R8*1), R13; \
	CMPQ BX, $8; \
	CMOVQGE R13, R10; \
	LD((R10), K1, Z7); \
	LEAQ (R10)(R8*1), R13; \
	CMPQ BX, $9; \
	CMOVQGE R13, R10; \
	LD((R10), K1, Z8); \
	LEAQ (R10)(R8*1), R13; \
	CMPQ BX, $10; \
	CMOVQGE R13, R10; \
	LD((R10), K1, Z9); \
	LEAQ (R10)(R8*1), R13; \
	CMPQ BX, $11; \
	CMOVQGE R13, R10; \
	LD((R10), K1, Z10); \
	LEAQ (R10)(R8*1), R13; \
	CMPQ BX, $12; \
	CMOVQGE R13, R10; \
	LD((R10), K1, Z11); \
	LEAQ (R10)(R8*1), R13; \
	CMPQ BX, $13; \
	CMOVQGE R13, R10; \
	LD((R10), K1, Z12); \
	LEAQ (R10)(R8*1), R13; \
	CMPQ BX, $14; \
	CMOVQGE R13, R10; \
	LD((R10), K1, Z13); \
	LEAQ (R10)(R8*1), R13; \
	CMPQ BX, $15; \
	CMOVQGE R13, R10; \
	LD((R10), K1, Z14); \
	LEAQ (R10)(R8*1), R13; \
	CMPQ BX, $16; \
	CMOVQGE R13, R10; \
	LD((R10), K1, Z15)

// PT_TRANSPOSE16 transposes Z0..Z15 in place through Z16..Z31.
#define PT_TRANSPOSE16 \
	VUNPCKLPS Z1, Z0, Z16; \
	VUNPCKHPS Z1, Z0, Z17; \
	VUNPCKLPS Z3, Z2, Z18; \
	VUNPCKHPS Z3, Z2, Z19; \
	VUNPCKLPS Z5, Z4, Z20; \
	VUNPCKHPS Z5, Z4, Z21; \
	VUNPCKLPS Z7, Z6, Z22; \
	VUNPCKHPS Z7, Z6, Z23; \
	VUNPCKLPS Z9, Z8, Z24; \
	VUNPCKHPS Z9, Z8, Z25; \
	VUNPCKLPS Z11, Z10, Z26; \
	VUNPCKHPS Z11, Z10, Z27; \
	VUNPCKLPS Z13, Z12, Z28; \
	VUNPCKHPS Z13, Z12, Z29; \
	VUNPCKLPS Z15, Z14, Z30; \
	VUNPCKHPS Z15, Z14, Z31; \
	VUNPCKLPD Z18, Z16, Z0; \
	VUNPCKHPD Z18, Z16, Z1; \
	VUNPCKLPD Z19, Z17, Z2; \
	VUNPCKHPD Z19, Z17, Z3; \
	VUNPCKLPD Z22, Z20, Z4; \
	VUNPCKHPD Z22, Z20, Z5; \
	VUNPCKLPD Z23, Z21, Z6; \
	VUNPCKHPD Z23, Z21, Z7; \
	VUNPCKLPD Z26, Z24, Z8; \
	VUNPCKHPD Z26, Z24, Z9; \
	VUNPCKLPD Z27, Z25, Z10; \
	VUNPCKHPD Z27, Z25, Z11; \
	VUNPCKLPD Z30, Z28, Z12; \
	VUNPCKHPD Z30, Z28, Z13; \
	VUNPCKLPD Z31, Z29, Z14; \
	VUNPCKHPD Z31, Z29, Z15; \
	VSHUFF32X4 $0x44, Z4, Z0, Z16; \
	VSHUFF32X4 $0xEE, Z4, Z0, Z17; \
	VSHUFF32X4 $0x44, Z12, Z8, Z18; \
	VSHUFF32X4 $0xEE, Z12, Z8, Z19; \
	VSHUFF32X4 $0x44, Z5, Z1, Z20; \
	VSHUFF32X4 $0xEE, Z5, Z1, Z21; \
	VSHUFF32X4 $0x44, Z13, Z9, Z22; \
	VSHUFF32X4 $0xEE, Z13, Z9, Z23; \
	VSHUFF32X4 $0x44, Z6, Z2, Z24; \
	VSHUFF32X4 $0xEE, Z6, Z2, Z25; \
	VSHUFF32X4 $0x44, Z14, Z10, Z26; \
	VSHUFF32X4 $0xEE, Z14, Z10, Z27; \
	VSHUFF32X4 $0x44, Z7, Z3, Z28; \
	VSHUFF32X4 $0xEE, Z7, Z3, Z29; \
	VSHUFF32X4 $0x44, Z15, Z11, Z30; \
	VSHUFF32X4 $0xEE, Z15, Z11, Z31; \
	VSHUFF32X4 $0x88, Z18, Z16, Z0; \
	VSHUFF32X4 $0xDD, Z18, Z16, Z4; \
	VSHUFF32X4 $0x88, Z19, Z17, Z8; \
	VSHUFF32X4 $0xDD, Z19, Z17, Z12; \
	VSHUFF32X4 $0x88, Z22, Z20, Z1; \
	VSHUFF32X4 $0xDD, Z22, Z20, Z5; \
	VSHUFF32X4 $0x88, Z23, Z21, Z9; \
	VSHUFF32X4 $0xDD, Z23, Z21, Z13; \
	VSHUFF32X4 $0x88, Z26, Z24, Z2; \
	VSHUFF32X4 $0xDD, Z26, Z24, Z6; \
	VSHUFF32X4 $0x88, Z27, Z25, Z10; \
	VSHUFF32X4 $0xDD, Z27, Z25, Z14; \
	VSHUFF32X4 $0x88, Z30, Z28, Z3; \
	VSHUFF32X4 $0xDD, Z30, Z28, Z7; \
	VSHUFF32X4 $0x88, Z31, Z29, Z11; \
	VSHUFF32X4 $0xDD, Z31, Z29, Z15

#define PACKTRANS16(LD, BLOCKBYTES) \
	SHLQ $2, DX; \
	MOVQ BX, CX; \
	MOVQ $1, AX; \
	SHLQ CX, AX; \
	DECQ AX; \
	KMOVW AX, K2; \
	MOVQ R9, R11; \
	SHRQ $4, R11; \
	ANDQ $15, R9; \
	KXNORW K0, K0, K1; \
	TESTQ R11, R11; \
	JZ   ptrtail; \
ptrblock: \
	PT_LOAD16(LD); \
	PT_TRANSPOSE16; \
	MOVQ DI, R10; \
	VMOVUPS Z0, K2, (R10); \
	ADDQ DX, R10; \
	VMOVUPS Z1, K2, (R10); \
	ADDQ DX, R10; \
	VMOVUPS Z2, K2, (R10); \
	ADDQ DX, R10; \
	VMOVUPS Z3, K2, (R10); \
	ADDQ DX, R10; \
	VMOVUPS Z4, K2, (R10); \
	ADDQ DX, R10; \
	VMOVUPS Z5, K2, (R10); \
	ADDQ DX, R10; \
	VMOVUPS Z6, K2, (R10); \
	ADDQ DX, R10; \
	VMOVUPS Z7, K2, (R10); \
	ADDQ DX, R10; \
	VMOVUPS Z8, K2, (R10); \
	ADDQ DX, R10; \
	VMOVUPS Z9, K2, (R10); \
	ADDQ DX, R10; \
	VMOVUPS Z10, K2, (R10); \
	ADDQ DX, R10; \
	VMOVUPS Z11, K2, (R10); \
	ADDQ DX, R10; \
	VMOVUPS Z12, K2, (R10); \
	ADDQ DX, R10; \
	VMOVUPS Z13, K2, (R10); \
	ADDQ DX, R10; \
	VMOVUPS Z14, K2, (R10); \
	ADDQ DX, R10; \
	VMOVUPS Z15, K2, (R10); \
	ADDQ DX, R10; \
	MOVQ R10, DI; \
	ADDQ $BLOCKBYTES, SI; \
	DECQ R11; \
	JNZ  ptrblock; \
ptrtail: \
	TESTQ R9, R9; \
	JZ    ptrdone; \
	MOVQ R9, CX; \
	MOVQ $1, AX; \
	SHLQ CX, AX; \
	DECQ AX; \
	KMOVW AX, K1; \
	PT_LOAD16(LD); \
	PT_TRANSPOSE16; \
	MOVQ DI, R10; \
	VMOVUPS Z0, K2, (R10); \
	CMPQ R9, $1; \
	JLE  ptrdone; \
	ADDQ DX, R10; \
	VMOVUPS Z1, K2, (R10); \
	CMPQ R9, $2; \
	JLE  ptrdone; \
	ADDQ DX, R10; \
	VMOVUPS Z2, K2, (R10); \
	CMPQ R9, $3; \
	JLE  ptrdone; \
	ADDQ DX, R10; \
	VMOVUPS Z3, K2, (R10); \
	CMPQ R9, $4; \
	JLE  ptrdone; \
	ADDQ DX, R10; \
	VMOVUPS Z4, K2, (R10); \
	CMPQ R9, $5; \
	JLE  ptrdone; \
	ADDQ DX, R10; \
	VMOVUPS Z5, K2, (R10); \
	CMPQ R9, $6; \
	JLE  ptrdone; \
	ADDQ DX, R10; \
	VMOVUPS Z6, K2, (R10); \
	CMPQ R9, $7; \
	JLE  ptrdone; \
	ADDQ DX, R10; \
	VMOVUPS Z7, K2, (R10); \
	CMPQ R9, $8; \
	JLE  ptrdone; \
	ADDQ DX, R10; \
	VMOVUPS Z8, K2, (R10); \
	CMPQ R9, $9; \
	JLE  ptrdone; \
	ADDQ DX, R10; \
	VMOVUPS Z9, K2, (R10); \
	CMPQ R9, $10; \
	JLE  ptrdone; \
	ADDQ DX, R10; \
	VMOVUPS Z10, K2, (R10); \
	CMPQ R9, $11; \
	JLE  ptrdone; \
	ADDQ DX, R10; \
	VMOVUPS Z11, K2, (R10); \
	CMPQ R9, $12; \
	JLE  ptrdone; \
	ADDQ DX, R10; \
	VMOVUPS Z12, K2, (R10); \
	CMPQ R9, $13; \
	JLE  ptrdone; \
	ADDQ DX, R10; \
	VMOVUPS Z13, K2, (R10); \
	CMPQ R9, $14; \
	JLE  ptrdone; \
	ADDQ DX, R10; \
	VMOVUPS Z14, K2, (R10); \
	CMPQ R9, $15; \
	JLE  ptrdone; \
	ADDQ DX, R10; \
	VMOVUPS Z15, K2, (R10); \
ptrdone: \
	VZEROUPPER; \
	RET

// func packTrans16AVX512(dst, src *float32, rows, srcStride, kc, dstStep int)
//
//	for r in [0,rows), p in [0,kc): dst[p*dstStep+r] = src[r*srcStride+p]
//
// 1 <= rows <= 16, kc >= 1. Each 16 k steps of the rows are loaded as 16
// vectors (rows past the last repeat it; their lanes are never stored),
// transposed in registers and stored as 16 runs of rows values, so every
// source and destination cache line is touched once.
TEXT ·packTrans16AVX512(SB), NOSPLIT, $0-48
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ rows+16(FP), BX
	MOVQ srcStride+24(FP), R8
	SHLQ $2, R8
	MOVQ kc+32(FP), R9
	MOVQ dstStep+40(FP), DX
	PACKTRANS16(LD_F32, 64)

// func packTrans16HalfAVX512(dst *float32, src *uint16, rows, srcStride, kc, dstStep int)
//
// packTrans16AVX512 from a bfloat16 source, each element widened to
// float32 as it is loaded.
TEXT ·packTrans16HalfAVX512(SB), NOSPLIT, $0-48
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ rows+16(FP), BX
	MOVQ srcStride+24(FP), R8
	SHLQ $1, R8
	MOVQ kc+32(FP), R9
	MOVQ dstStep+40(FP), DX
	PACKTRANS16(LD_BF16, 32)

// PACKCOPY is packCopyAVX512's body once its arguments are in registers
// (DI dst, SI src, R9 kc, R8 the source's row stride in bytes, BX panels,
// DX width, AX ldMask, CX stMask): LD as for PACKTRANS16, ESHIFT the log2
// of the source element's bytes, HIGH the source bytes of 16 elements (the
// offset of a panel's second vector). R11 becomes the source bytes between
// panels, DX the destination's.
#define PACKCOPY(LD, ESHIFT, HIGH) \
	MOVQ DX, R11; \
	SHLQ $ESHIFT, R11; \
	SHLQ $2, DX; \
	KMOVW AX, K1; \
	SHRL $16, AX; \
	KMOVW AX, K2; \
	KMOVW CX, K3; \
	SHRL $16, CX; \
	KMOVW CX, K4; \
	MOVQ R9, R12; \
	IMULQ DX, R12; \
pcrow: \
	MOVQ SI, AX; \
	MOVQ DI, R10; \
	MOVQ BX, CX; \
pcpanel: \
	LD((AX), K1, Z0); \
	LD(HIGH(AX), K2, Z1); \
	VMOVUPS Z0, K3, (R10); \
	VMOVUPS Z1, K4, 64(R10); \
	ADDQ R11, AX; \
	ADDQ R12, R10; \
	DECQ CX; \
	JNZ  pcpanel; \
	ADDQ R8, SI; \
	ADDQ DX, DI; \
	DECQ R9; \
	JNZ  pcrow; \
	VZEROUPPER; \
	RET

// func packCopyAVX512(dst, src *float32, kc, srcStride, panels, width int, ldMask, stMask uint32)
//
//	for p in [0,kc), j in [0,panels), l in [0,width):
//		dst[j*kc*width + p*width + l] = src[p*srcStride + j*width + l] if lane l of ldMask, else 0
//
// Packs panels of width <= 32 columns whose k steps are contiguous in the
// source (rows of a non-transposed B, columns of a transposed A), walking
// each source row once across all the panels. stMask has the low width
// bits set; ldMask those of the columns that exist.
TEXT ·packCopyAVX512(SB), NOSPLIT, $0-56
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ kc+16(FP), R9
	MOVQ srcStride+24(FP), R8
	SHLQ $2, R8
	MOVQ panels+32(FP), BX
	MOVQ width+40(FP), DX
	MOVL ldMask+48(FP), AX
	MOVL stMask+52(FP), CX
	PACKCOPY(LD_F32, 2, 64)

// func packCopyHalfAVX512(dst *float32, src *uint16, kc, srcStride, panels, width int, ldMask, stMask uint32)
//
// packCopyAVX512 from a bfloat16 source, each element widened to float32
// as it is loaded.
TEXT ·packCopyHalfAVX512(SB), NOSPLIT, $0-56
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ kc+16(FP), R9
	MOVQ srcStride+24(FP), R8
	SHLQ $1, R8
	MOVQ panels+32(FP), BX
	MOVQ width+40(FP), DX
	MOVL ldMask+48(FP), AX
	MOVL stMask+52(FP), CX
	PACKCOPY(LD_BF16, 1, 32)

