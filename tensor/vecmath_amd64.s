//go:build !noasm

#include "textflag.h"

// AVX2+FMA loops for the exp-heavy row kernels (cpu_kernels.go): 8 floats
// per iteration, the tail left to the Go caller. exp follows exp32
// (math32.go): n = round(x*log2(e)), r = x - n*ln2 in two parts, a degree-7
// polynomial for exp(r), times 2^n from the exponent bits. Inputs are
// clamped to [-87.33654, 88]; NaN stays NaN.

DATA expHi<>+0(SB)/4, $0x42b00000
DATA expHi<>+4(SB)/4, $0x42b00000
DATA expHi<>+8(SB)/4, $0x42b00000
DATA expHi<>+12(SB)/4, $0x42b00000
DATA expHi<>+16(SB)/4, $0x42b00000
DATA expHi<>+20(SB)/4, $0x42b00000
DATA expHi<>+24(SB)/4, $0x42b00000
DATA expHi<>+28(SB)/4, $0x42b00000
GLOBL expHi<>(SB), RODATA|NOPTR, $32

DATA expLo<>+0(SB)/4, $0xc2aeac4f
DATA expLo<>+4(SB)/4, $0xc2aeac4f
DATA expLo<>+8(SB)/4, $0xc2aeac4f
DATA expLo<>+12(SB)/4, $0xc2aeac4f
DATA expLo<>+16(SB)/4, $0xc2aeac4f
DATA expLo<>+20(SB)/4, $0xc2aeac4f
DATA expLo<>+24(SB)/4, $0xc2aeac4f
DATA expLo<>+28(SB)/4, $0xc2aeac4f
GLOBL expLo<>(SB), RODATA|NOPTR, $32

DATA log2e<>+0(SB)/4, $0x3fb8aa3b
DATA log2e<>+4(SB)/4, $0x3fb8aa3b
DATA log2e<>+8(SB)/4, $0x3fb8aa3b
DATA log2e<>+12(SB)/4, $0x3fb8aa3b
DATA log2e<>+16(SB)/4, $0x3fb8aa3b
DATA log2e<>+20(SB)/4, $0x3fb8aa3b
DATA log2e<>+24(SB)/4, $0x3fb8aa3b
DATA log2e<>+28(SB)/4, $0x3fb8aa3b
GLOBL log2e<>(SB), RODATA|NOPTR, $32

DATA expC1<>+0(SB)/4, $0x3f318000
DATA expC1<>+4(SB)/4, $0x3f318000
DATA expC1<>+8(SB)/4, $0x3f318000
DATA expC1<>+12(SB)/4, $0x3f318000
DATA expC1<>+16(SB)/4, $0x3f318000
DATA expC1<>+20(SB)/4, $0x3f318000
DATA expC1<>+24(SB)/4, $0x3f318000
DATA expC1<>+28(SB)/4, $0x3f318000
GLOBL expC1<>(SB), RODATA|NOPTR, $32

DATA expC2<>+0(SB)/4, $0xb95e8083
DATA expC2<>+4(SB)/4, $0xb95e8083
DATA expC2<>+8(SB)/4, $0xb95e8083
DATA expC2<>+12(SB)/4, $0xb95e8083
DATA expC2<>+16(SB)/4, $0xb95e8083
DATA expC2<>+20(SB)/4, $0xb95e8083
DATA expC2<>+24(SB)/4, $0xb95e8083
DATA expC2<>+28(SB)/4, $0xb95e8083
GLOBL expC2<>(SB), RODATA|NOPTR, $32

DATA expP0<>+0(SB)/4, $0x39506967
DATA expP0<>+4(SB)/4, $0x39506967
DATA expP0<>+8(SB)/4, $0x39506967
DATA expP0<>+12(SB)/4, $0x39506967
DATA expP0<>+16(SB)/4, $0x39506967
DATA expP0<>+20(SB)/4, $0x39506967
DATA expP0<>+24(SB)/4, $0x39506967
DATA expP0<>+28(SB)/4, $0x39506967
GLOBL expP0<>(SB), RODATA|NOPTR, $32

DATA expP1<>+0(SB)/4, $0x3ab743ce
DATA expP1<>+4(SB)/4, $0x3ab743ce
DATA expP1<>+8(SB)/4, $0x3ab743ce
DATA expP1<>+12(SB)/4, $0x3ab743ce
DATA expP1<>+16(SB)/4, $0x3ab743ce
DATA expP1<>+20(SB)/4, $0x3ab743ce
DATA expP1<>+24(SB)/4, $0x3ab743ce
DATA expP1<>+28(SB)/4, $0x3ab743ce
GLOBL expP1<>(SB), RODATA|NOPTR, $32

DATA expP2<>+0(SB)/4, $0x3c088908
DATA expP2<>+4(SB)/4, $0x3c088908
DATA expP2<>+8(SB)/4, $0x3c088908
DATA expP2<>+12(SB)/4, $0x3c088908
DATA expP2<>+16(SB)/4, $0x3c088908
DATA expP2<>+20(SB)/4, $0x3c088908
DATA expP2<>+24(SB)/4, $0x3c088908
DATA expP2<>+28(SB)/4, $0x3c088908
GLOBL expP2<>(SB), RODATA|NOPTR, $32

DATA expP3<>+0(SB)/4, $0x3d2aa9c1
DATA expP3<>+4(SB)/4, $0x3d2aa9c1
DATA expP3<>+8(SB)/4, $0x3d2aa9c1
DATA expP3<>+12(SB)/4, $0x3d2aa9c1
DATA expP3<>+16(SB)/4, $0x3d2aa9c1
DATA expP3<>+20(SB)/4, $0x3d2aa9c1
DATA expP3<>+24(SB)/4, $0x3d2aa9c1
DATA expP3<>+28(SB)/4, $0x3d2aa9c1
GLOBL expP3<>(SB), RODATA|NOPTR, $32

DATA expP4<>+0(SB)/4, $0x3e2aaaaa
DATA expP4<>+4(SB)/4, $0x3e2aaaaa
DATA expP4<>+8(SB)/4, $0x3e2aaaaa
DATA expP4<>+12(SB)/4, $0x3e2aaaaa
DATA expP4<>+16(SB)/4, $0x3e2aaaaa
DATA expP4<>+20(SB)/4, $0x3e2aaaaa
DATA expP4<>+24(SB)/4, $0x3e2aaaaa
DATA expP4<>+28(SB)/4, $0x3e2aaaaa
GLOBL expP4<>(SB), RODATA|NOPTR, $32

DATA expP5<>+0(SB)/4, $0x3f000000
DATA expP5<>+4(SB)/4, $0x3f000000
DATA expP5<>+8(SB)/4, $0x3f000000
DATA expP5<>+12(SB)/4, $0x3f000000
DATA expP5<>+16(SB)/4, $0x3f000000
DATA expP5<>+20(SB)/4, $0x3f000000
DATA expP5<>+24(SB)/4, $0x3f000000
DATA expP5<>+28(SB)/4, $0x3f000000
GLOBL expP5<>(SB), RODATA|NOPTR, $32

DATA one<>+0(SB)/4, $0x3f800000
DATA one<>+4(SB)/4, $0x3f800000
DATA one<>+8(SB)/4, $0x3f800000
DATA one<>+12(SB)/4, $0x3f800000
DATA one<>+16(SB)/4, $0x3f800000
DATA one<>+20(SB)/4, $0x3f800000
DATA one<>+24(SB)/4, $0x3f800000
DATA one<>+28(SB)/4, $0x3f800000
GLOBL one<>(SB), RODATA|NOPTR, $32

DATA exp127<>+0(SB)/4, $0x0000007f
DATA exp127<>+4(SB)/4, $0x0000007f
DATA exp127<>+8(SB)/4, $0x0000007f
DATA exp127<>+12(SB)/4, $0x0000007f
DATA exp127<>+16(SB)/4, $0x0000007f
DATA exp127<>+20(SB)/4, $0x0000007f
DATA exp127<>+24(SB)/4, $0x0000007f
DATA exp127<>+28(SB)/4, $0x0000007f
GLOBL exp127<>(SB), RODATA|NOPTR, $32

DATA geluA<>+0(SB)/4, $0x3d372713
DATA geluA<>+4(SB)/4, $0x3d372713
DATA geluA<>+8(SB)/4, $0x3d372713
DATA geluA<>+12(SB)/4, $0x3d372713
DATA geluA<>+16(SB)/4, $0x3d372713
DATA geluA<>+20(SB)/4, $0x3d372713
DATA geluA<>+24(SB)/4, $0x3d372713
DATA geluA<>+28(SB)/4, $0x3d372713
GLOBL geluA<>(SB), RODATA|NOPTR, $32

DATA gelu2S<>+0(SB)/4, $0x3fcc422a
DATA gelu2S<>+4(SB)/4, $0x3fcc422a
DATA gelu2S<>+8(SB)/4, $0x3fcc422a
DATA gelu2S<>+12(SB)/4, $0x3fcc422a
DATA gelu2S<>+16(SB)/4, $0x3fcc422a
DATA gelu2S<>+20(SB)/4, $0x3fcc422a
DATA gelu2S<>+24(SB)/4, $0x3fcc422a
DATA gelu2S<>+28(SB)/4, $0x3fcc422a
GLOBL gelu2S<>(SB), RODATA|NOPTR, $32

DATA geluS<>+0(SB)/4, $0x3f4c422a
DATA geluS<>+4(SB)/4, $0x3f4c422a
DATA geluS<>+8(SB)/4, $0x3f4c422a
DATA geluS<>+12(SB)/4, $0x3f4c422a
DATA geluS<>+16(SB)/4, $0x3f4c422a
DATA geluS<>+20(SB)/4, $0x3f4c422a
DATA geluS<>+24(SB)/4, $0x3f4c422a
DATA geluS<>+28(SB)/4, $0x3f4c422a
GLOBL geluS<>(SB), RODATA|NOPTR, $32

DATA gelu3AS<>+0(SB)/4, $0x3ddb33b6
DATA gelu3AS<>+4(SB)/4, $0x3ddb33b6
DATA gelu3AS<>+8(SB)/4, $0x3ddb33b6
DATA gelu3AS<>+12(SB)/4, $0x3ddb33b6
DATA gelu3AS<>+16(SB)/4, $0x3ddb33b6
DATA gelu3AS<>+20(SB)/4, $0x3ddb33b6
DATA gelu3AS<>+24(SB)/4, $0x3ddb33b6
DATA gelu3AS<>+28(SB)/4, $0x3ddb33b6
GLOBL gelu3AS<>(SB), RODATA|NOPTR, $32

// EXP8 sets Y0 = exp(Y0), lanewise. It needs Y15 = expHi, Y14 = expLo and
// clobbers Y1-Y3.
#define EXP8 \
	VMINPS       Y0, Y15, Y0 \
	VMAXPS       Y0, Y14, Y0 \
	VMULPS       log2e<>(SB), Y0, Y1 \
	VROUNDPS     $0, Y1, Y1 \
	VFNMADD231PS expC1<>(SB), Y1, Y0 \
	VFNMADD231PS expC2<>(SB), Y1, Y0 \
	VMOVUPS      expP0<>(SB), Y2 \
	VFMADD213PS  expP1<>(SB), Y0, Y2 \
	VFMADD213PS  expP2<>(SB), Y0, Y2 \
	VFMADD213PS  expP3<>(SB), Y0, Y2 \
	VFMADD213PS  expP4<>(SB), Y0, Y2 \
	VFMADD213PS  expP5<>(SB), Y0, Y2 \
	VMULPS       Y0, Y0, Y3 \
	VFMADD213PS  Y0, Y3, Y2 \
	VADDPS       one<>(SB), Y2, Y2 \
	VCVTPS2DQ    Y1, Y1 \
	VPADDD       exp127<>(SB), Y1, Y1 \
	VPSLLD       $23, Y1, Y1 \
	VMULPS       Y1, Y2, Y0

// SUM8 adds the 8 floats of Y0 to the float64 accumulators Y9, Y10;
// clobbers Y1, Y2.
#define SUM8 \
	VCVTPS2PD    X0, Y1 \
	VEXTRACTF128 $1, Y0, X2 \
	VCVTPS2PD    X2, Y2 \
	VADDPD       Y1, Y9, Y9 \
	VADDPD       Y2, Y10, Y10

// HSUM sets X9 to the sum of the 8 float64 lanes of Y9 and Y10.
#define HSUM \
	VADDPD       Y10, Y9, Y9 \
	VEXTRACTF128 $1, Y9, X1 \
	VADDPD       X1, X9, X9 \
	VUNPCKHPD    X9, X9, X1 \
	VADDSD       X1, X9, X9

// func geluFwdAVX2(out, inp *float32, n int)
// out = x - x/(exp(2u)+1) = 0.5*x*(1+tanh(u)), u = sqrt(2/pi)*(x+0.044715*x^3).
TEXT ·geluFwdAVX2(SB), NOSPLIT, $0-24
	MOVQ    out+0(FP), DI
	MOVQ    inp+8(FP), SI
	MOVQ    n+16(FP), CX
	VMOVUPS expHi<>(SB), Y15
	VMOVUPS expLo<>(SB), Y14
	VMOVUPS one<>(SB), Y13

geluFwdLoop:
	CMPQ        CX, $8
	JL          geluFwdDone
	VMOVUPS     (SI), Y5
	VMULPS      Y5, Y5, Y0
	VMULPS      geluA<>(SB), Y0, Y0
	VFMADD213PS Y5, Y5, Y0
	VMULPS      gelu2S<>(SB), Y0, Y0
	EXP8
	VADDPS      Y13, Y0, Y0
	VDIVPS      Y0, Y5, Y1
	VSUBPS      Y1, Y5, Y1
	VMOVUPS     Y1, (DI)
	ADDQ        $32, SI
	ADDQ        $32, DI
	SUBQ        $8, CX
	JMP         geluFwdLoop

geluFwdDone:
	VZEROUPPER
	RET

// func geluBwdAVX2(dinp, inp, dout *float32, n int)
// dinp += (1-w)*(1+2*x*w*du) * dout, w = 1/(exp(2u)+1), du = sqrt(2/pi)*(1+3*0.044715*x^2).
TEXT ·geluBwdAVX2(SB), NOSPLIT, $0-32
	MOVQ    dinp+0(FP), DI
	MOVQ    inp+8(FP), SI
	MOVQ    dout+16(FP), DX
	MOVQ    n+24(FP), CX
	VMOVUPS expHi<>(SB), Y15
	VMOVUPS expLo<>(SB), Y14
	VMOVUPS one<>(SB), Y13

geluBwdLoop:
	CMPQ         CX, $8
	JL           geluBwdDone
	VMOVUPS      (SI), Y5
	VMULPS       Y5, Y5, Y6
	VMULPS       geluA<>(SB), Y6, Y0
	VFMADD213PS  Y5, Y5, Y0
	VMULPS       gelu2S<>(SB), Y0, Y0
	EXP8
	VADDPS       Y13, Y0, Y0
	VDIVPS       Y0, Y13, Y7
	VMOVUPS      geluS<>(SB), Y8
	VFMADD231PS  gelu3AS<>(SB), Y6, Y8
	VMULPS       Y7, Y5, Y9
	VMULPS       Y8, Y9, Y9
	VADDPS       Y9, Y9, Y9
	VADDPS       Y13, Y9, Y9
	VSUBPS       Y7, Y13, Y10
	VMULPS       Y10, Y9, Y9
	VMOVUPS      (DX), Y11
	VMOVUPS      (DI), Y12
	VFMADD231PS  Y11, Y9, Y12
	VMOVUPS      Y12, (DI)
	ADDQ         $32, SI
	ADDQ         $32, DI
	ADDQ         $32, DX
	SUBQ         $8, CX
	JMP          geluBwdLoop

geluBwdDone:
	VZEROUPPER
	RET

// func expShiftAVX2(dst, src *float32, n int, scale, shift float32) float64
// dst[i] = exp(scale*(src[i]-shift)); returns the sum of dst in float64.
TEXT ·expShiftAVX2(SB), NOSPLIT, $0-40
	MOVQ         dst+0(FP), DI
	MOVQ         src+8(FP), SI
	MOVQ         n+16(FP), CX
	VBROADCASTSS scale+24(FP), Y12
	VBROADCASTSS shift+28(FP), Y11
	VMOVUPS      expHi<>(SB), Y15
	VMOVUPS      expLo<>(SB), Y14
	VXORPD       Y9, Y9, Y9
	VXORPD       Y10, Y10, Y10

expShiftLoop:
	CMPQ    CX, $8
	JL      expShiftDone
	VMOVUPS (SI), Y0
	VSUBPS  Y11, Y0, Y0
	VMULPS  Y12, Y0, Y0
	EXP8
	VMOVUPS Y0, (DI)
	SUM8
	ADDQ    $32, SI
	ADDQ    $32, DI
	SUBQ    $8, CX
	JMP     expShiftLoop

expShiftDone:
	HSUM
	VMOVSD  X9, ret+32(FP)
	VZEROUPPER
	RET

// func expSumAVX2(src *float32, n int, shift float32) float64
// returns the sum of exp(src[i]-shift) in float64.
TEXT ·expSumAVX2(SB), NOSPLIT, $0-32
	MOVQ         src+0(FP), SI
	MOVQ         n+8(FP), CX
	VBROADCASTSS shift+16(FP), Y11
	VMOVUPS      expHi<>(SB), Y15
	VMOVUPS      expLo<>(SB), Y14
	VXORPD       Y9, Y9, Y9
	VXORPD       Y10, Y10, Y10

expSumLoop:
	CMPQ    CX, $8
	JL      expSumDone
	VMOVUPS (SI), Y0
	VSUBPS  Y11, Y0, Y0
	EXP8
	SUM8
	ADDQ    $32, SI
	SUBQ    $8, CX
	JMP     expSumLoop

expSumDone:
	HSUM
	VMOVSD  X9, ret+24(FP)
	VZEROUPPER
	RET

// func expAxpyAVX2(dst, src *float32, n int, shift, alpha float32)
// dst[i] += alpha*exp(src[i]-shift).
TEXT ·expAxpyAVX2(SB), NOSPLIT, $0-32
	MOVQ         dst+0(FP), DI
	MOVQ         src+8(FP), SI
	MOVQ         n+16(FP), CX
	VBROADCASTSS shift+24(FP), Y11
	VBROADCASTSS alpha+28(FP), Y12
	VMOVUPS      expHi<>(SB), Y15
	VMOVUPS      expLo<>(SB), Y14

expAxpyLoop:
	CMPQ        CX, $8
	JL          expAxpyDone
	VMOVUPS     (SI), Y0
	VSUBPS      Y11, Y0, Y0
	EXP8
	VMOVUPS     (DI), Y4
	VFMADD231PS Y12, Y0, Y4
	VMOVUPS     Y4, (DI)
	ADDQ        $32, SI
	ADDQ        $32, DI
	SUBQ        $8, CX
	JMP         expAxpyLoop

expAxpyDone:
	VZEROUPPER
	RET

// func expScaleAVX2(x *float32, n int, shift, alpha float32)
// x[i] = alpha*exp(x[i]-shift), in place.
TEXT ·expScaleAVX2(SB), NOSPLIT, $0-24
	MOVQ         x+0(FP), DI
	MOVQ         n+8(FP), CX
	VBROADCASTSS shift+16(FP), Y11
	VBROADCASTSS alpha+20(FP), Y12
	VMOVUPS      expHi<>(SB), Y15
	VMOVUPS      expLo<>(SB), Y14

expScaleLoop:
	CMPQ    CX, $8
	JL      expScaleDone
	VMOVUPS (DI), Y0
	VSUBPS  Y11, Y0, Y0
	EXP8
	VMULPS  Y12, Y0, Y0
	VMOVUPS Y0, (DI)
	ADDQ    $32, DI
	SUBQ    $8, CX
	JMP     expScaleLoop

expScaleDone:
	VZEROUPPER
	RET

// func maxAVX2(src *float32, n int) float32
// returns the largest of src[:n]; n is a positive multiple of 8.
TEXT ·maxAVX2(SB), NOSPLIT, $0-20
	MOVQ    src+0(FP), SI
	MOVQ    n+8(FP), CX
	VMOVUPS (SI), Y4
	ADDQ    $32, SI
	SUBQ    $8, CX

maxLoop:
	CMPQ    CX, $8
	JL      maxDone
	VMAXPS  (SI), Y4, Y4
	ADDQ    $32, SI
	SUBQ    $8, CX
	JMP     maxLoop

maxDone:
	VEXTRACTF128 $1, Y4, X1
	VMAXPS       X1, X4, X4
	VPERMILPS    $0x4e, X4, X1
	VMAXPS       X1, X4, X4
	VPERMILPS    $0xb1, X4, X1
	VMAXPS       X1, X4, X4
	VMOVSS       X4, ret+16(FP)
	VZEROUPPER
	RET

// func adamwAVX2(p, grad, m, v *float32, n int, h *adamHyper)
//
// One AdamW step over n elements (n a multiple of 8), as adamK.run:
//
//	g' = g*gradScale
//	m = b1*m + (1-b1)*g';  v = b2*v + (1-b2)*g'^2
//	p -= lr*((m/bc1)/(sqrt(v/bc2)+eps) + wd*p)
//
// h holds gradScale, b1, 1-b1, b2, 1-b2, bc1, bc2, eps, lr, wd (float32s).
TEXT ·adamwAVX2(SB), NOSPLIT, $0-48
	MOVQ p+0(FP), DI
	MOVQ grad+8(FP), SI
	MOVQ m+16(FP), DX
	MOVQ v+24(FP), CX
	MOVQ n+32(FP), BX
	MOVQ h+40(FP), AX
	VBROADCASTSS 0(AX), Y8
	VBROADCASTSS 4(AX), Y9
	VBROADCASTSS 8(AX), Y10
	VBROADCASTSS 12(AX), Y11
	VBROADCASTSS 16(AX), Y12
	VBROADCASTSS 20(AX), Y13
	VBROADCASTSS 24(AX), Y14
	VBROADCASTSS 28(AX), Y15
	SHRQ $3, BX
	JZ   adamdone

adamloop:
	VMOVUPS (SI), Y0
	VMULPS  Y8, Y0, Y0
	VMULPS  (DX), Y9, Y1
	VFMADD231PS Y0, Y10, Y1
	VMOVUPS Y1, (DX)
	VMULPS  Y0, Y0, Y2
	VMULPS  (CX), Y11, Y3
	VFMADD231PS Y2, Y12, Y3
	VMOVUPS Y3, (CX)
	VDIVPS  Y13, Y1, Y1
	VDIVPS  Y14, Y3, Y3
	VSQRTPS Y3, Y3
	VADDPS  Y15, Y3, Y3
	VDIVPS  Y3, Y1, Y1
	VMOVUPS (DI), Y4
	VBROADCASTSS 36(AX), Y5
	VFMADD231PS Y4, Y5, Y1
	VBROADCASTSS 32(AX), Y6
	VFNMADD231PS Y1, Y6, Y4
	VMOVUPS Y4, (DI)
	ADDQ $32, DI
	ADDQ $32, SI
	ADDQ $32, DX
	ADDQ $32, CX
	DECQ BX
	JNZ  adamloop

adamdone:
	VZEROUPPER
	RET

// widenBF16AVX2 widens n (a multiple of 8) bfloat16 values of src into
// dst: each zero-extended to 32 bits and shifted up 16.
TEXT ·widenBF16AVX2(SB), NOSPLIT, $0-24
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), CX
widenLoop:
	TESTQ CX, CX
	JZ    widenDone
	VPMOVZXWD (SI), Y0
	VPSLLD    $16, Y0, Y0
	VMOVDQU   Y0, (DI)
	ADDQ      $16, SI
	ADDQ      $32, DI
	SUBQ      $8, CX
	JMP       widenLoop
widenDone:
	VZEROUPPER
	RET

// roundBF16AVX2 rounds n (a multiple of 8) floats of src to bfloat16 into
// dst as BF16FromFloat32 does: u + 0x7fff + (u>>16 & 1), the top half; a
// NaN keeps its top half with the quiet bit set.
TEXT ·roundBF16AVX2(SB), NOSPLIT, $0-24
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), CX
	MOVL $0x7fffffff, AX
	MOVD AX, X10
	VPBROADCASTD X10, Y10 // |u| mask
	MOVL $0x7f800000, AX
	MOVD AX, X11
	VPBROADCASTD X11, Y11 // infinity
	MOVL $0x7fff, AX
	MOVD AX, X12
	VPBROADCASTD X12, Y12 // rounding bias
	MOVL $1, AX
	MOVD AX, X13
	VPBROADCASTD X13, Y13
	MOVL $0x40, AX
	MOVD AX, X14
	VPBROADCASTD X14, Y14 // quiet bit, in the top half
roundLoop:
	TESTQ CX, CX
	JZ    roundDone
	VMOVDQU   (SI), Y0
	VPSRLD    $16, Y0, Y1
	VPAND     Y13, Y1, Y2
	VPADDD    Y12, Y0, Y3
	VPADDD    Y2, Y3, Y3
	VPSRLD    $16, Y3, Y3
	VPOR      Y14, Y1, Y4
	VPAND     Y10, Y0, Y5
	VPCMPGTD  Y11, Y5, Y6
	VPBLENDVB Y6, Y4, Y3, Y3
	VPACKUSDW Y3, Y3, Y7
	VPERMQ    $0x08, Y7, Y7
	VMOVDQU   X7, (DI)
	ADDQ      $32, SI
	ADDQ      $16, DI
	SUBQ      $8, CX
	JMP       roundLoop
roundDone:
	VZEROUPPER
	RET
