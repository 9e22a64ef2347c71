// RAII owner of an XXH3-64 streaming state (xxHash), so every error path frees it. On
// x86-64, XXH3_64bits and XXH3_64bits_update are libxxhash's run-time dispatched forms
// (xxh_x86dispatch.h: AVX2 / AVX-512 where the CPU has them; Debian builds the plain ones
// for SSE2): the same hashes, faster. Include this header, not <xxhash.h>.
#pragma once
#include <xxhash.h>
#if defined(__x86_64__)
#include <xxh_x86dispatch.h>
#endif

#include <memory>
#include <new>

namespace ckpt {

struct Xxh3Free {
    void operator()(XXH3_state_t* s) const { XXH3_freeState(s); }
};
using Xxh3State = std::unique_ptr<XXH3_state_t, Xxh3Free>;

/// A fresh XXH3-64 state, already reset (seed 0). Throws std::bad_alloc.
inline Xxh3State make_xxh3() {
    Xxh3State s(XXH3_createState());
    if (!s) throw std::bad_alloc();
    XXH3_64bits_reset(s.get());
    return s;
}

}  // namespace ckpt
