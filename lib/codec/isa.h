// CKPT_ISA_CLONES: one function body compiled for each x86-64 instruction-set level
// (baseline, AVX2, AVX-512) and picked at run time by active_isa() (codec.h; CKPTKIT_ISA
// forces one). The loops it is used for (codec.cpp's block loops, rows.cpp's row
// prediction) compute the same IEEE operations in source order on every level (built
// with -ffp-contract=off), so their results are identical; docs/design.md §4.
#pragma once
#include <utility>

#include "codec/codec.h"

// The same function compiled for each instruction-set level: `flatten` inlines every
// call in it (block.h's loops), so all of them are compiled for that level. Selected at
// run time (active_isa); x86-64 only. Both upper levels include BMI1/BMI2, LZCNT and
// POPCNT (every AVX2 CPU has them; isa_supported checks): one-uop variable shifts (shlx /
// shrx), a leading-zero count and a population count for the entropy coder, where x86's
// shift by %cl costs 2-3 and bsr 2. CKPT_TARGET_AVX2 / CKPT_TARGET_AVX512 name each
// level's instruction sets, also for functions written with intrinsics (rans.cpp).
#if defined(__x86_64__)
#define CKPT_TARGET_AVX2 "avx2,bmi,bmi2,lzcnt,popcnt"
#define CKPT_TARGET_AVX512 CKPT_TARGET_AVX2 ",avx512f,avx512dq,avx512bw,avx512vl"
#define CKPT_ISA_CLONES(name, body_fn)                                                                     \
    template <class Q, class... A>                                                                      \
    __attribute__((target(CKPT_TARGET_AVX2), flatten)) void name##_avx2(A&&... a) {                                \
        body_fn<Q>(std::forward<A>(a)...);                                                              \
    }                                                                                                   \
    template <class Q, class... A>                                                                      \
    __attribute__((target(CKPT_TARGET_AVX512), flatten)) void name##_avx512(A&&... a) { \
        body_fn<Q>(std::forward<A>(a)...);                                                              \
    }                                                                                                   \
    template <class Q, class... A>                                                                      \
    void name(A&&... a) {                                                                               \
        switch (active_isa()) {                                                                         \
            case Isa::AVX512: return name##_avx512<Q>(std::forward<A>(a)...);                           \
            case Isa::AVX2: return name##_avx2<Q>(std::forward<A>(a)...);                               \
            case Isa::Baseline: break;                                                                  \
        }                                                                                               \
        body_fn<Q>(std::forward<A>(a)...);                                                              \
    }
#else
#define CKPT_ISA_CLONES(name, body_fn)       \
    template <class Q, class... A>          \
    void name(A&&... a) {                   \
        body_fn<Q>(std::forward<A>(a)...);  \
    }
#endif
