// RAII owner of an XXH3-64 streaming state (xxHash), so every error path frees it.
#pragma once
#include <xxhash.h>

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
