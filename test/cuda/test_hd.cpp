// CPU checks of what cuda/ relies on: the shared helpers in lib/codec/block.h equal
// the host-only code they replaced, and the backend table and device selection
// (codec/backend.h) answer as documented.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <stdexcept>

#include "codec/backend.h"
#include "codec/block.h"
#include "cuda/gpu_codec.h"

using namespace ckpt::codec;

namespace {
bool same_bits(double a, double b) { return std::memcmp(&a, &b, 8) == 0 || (a != a && b != b); }
double via_float16(double x) { return double(static_cast<float>(static_cast<_Float16>(x))); }
}  // namespace

TEST_CASE("round_half equals the host _Float16 cast (random doubles, ties, range ends)") {
    std::mt19937_64 g(7);
    long bad = 0;
    auto chk = [&](double x) { bad += !same_bits(double(float(round_half(x))), via_float16(x)); };
    for (int i = 0; i < 2'000'000; ++i) {
        uint64_t u = g();
        double x;
        std::memcpy(&x, &u, 8);
        chk(x);
        const double y = std::ldexp(double(g() >> 11) / 9007199254740992.0 * 2, int(g() % 50) - 30);
        chk(y);
        chk(-y);
        const double h = std::ldexp(double(g() % 2048 + 1024) + 0.5, int(g() % 40) - 35);  // exact ties
        chk(h);
        chk(std::nextafter(h, 0.0));
        chk(std::nextafter(h, INFINITY));
    }
    for (double x : {0.0, -0.0, 65504.0, 65519.99, 65520.0, 65536.0, 1e300, -1e-300, 5.96e-8, 2.9802322387695312e-08,
                     8.940696716308594e-08, 6.103515625e-05, 6.1035156249e-05, double(INFINITY), -double(INFINITY),
                     double(NAN)})
        chk(x);
    CHECK(bad == 0);
}

TEST_CASE("round_to keeps its meaning for every storage type") {
    std::mt19937 g(3);
    std::uniform_real_distribution<double> u(-10, 10);
    for (int i = 0; i < 100000; ++i) {
        const double x = std::ldexp(u(g), int(g() % 60) - 40);
        CHECK(same_bits(round_to(MomentType::F32, x), x));
        CHECK(same_bits(round_to(MomentType::F16, x), via_float16(x)));
        const float f = float(x);
        CHECK(same_bits(round_to(MomentType::BF16, x), BF16::from_code(BF16::rne(f))));
    }
}

TEST_CASE("blockwise8 constant maps equal the computed bitsandbytes map") {
    const DynamicMap s(true), u(false);
    for (int k = 0; k < 256; ++k) {
        const float a = Blockwise8::map_at(k, Role::ExpAvg), b = Blockwise8::map_at(k, Role::ExpAvgSq);
        CHECK(std::memcmp(&a, &s.v[k], 4) == 0);
        CHECK(std::memcmp(&b, &u.v[k], 4) == 0);
        const float c = Blockwise8::map_at(k, Role::MaxExpAvgSq);
        CHECK(std::memcmp(&c, &u.v[k], 4) == 0);
    }
}

TEST_CASE("log8 step cap precomputed in GuardConst matches the exp2 rule") {
    for (double tol : {1e-4, 1e-3, 0.003, 0.01, 0.1, 1.0})
        for (double b2 : {0.95, 0.99, 0.999, 0.9999})
            for (double step : {0.0, 10.0, 1000.0}) {
                AdamHyper h;
                h.beta2 = b2;
                h.step = step;
                const GuardConst gc = make_guard_const(h, tol);
                int cap = 1;
                while (cap < Log8::kMaxStep && gc.v_sens * (std::exp2((cap + 1) / 128.0) - 1) <= 0.55 * tol) ++cap;
                CHECK(gc.log8_v_step_cap == cap);
            }
}

TEST_CASE("device selection") {
    using namespace ckpt::codec;
    std::string why;
    const bool have = ckpt::gpu::gpu_available(&why);
    CHECK(backend(Device::Cpu).available(nullptr));
    CHECK(std::string(backend(Device::Cpu).name) == "cpu");
    CHECK(std::string(backend(Device::Cuda).name) == "cuda");
    CHECK(backend(Device::Cuda).available(nullptr) == have);
    CHECK(resolve_device("cpu") == Device::Cpu);
    CHECK(resolve_device("auto") == (have ? Device::Cuda : Device::Cpu));
    CHECK_THROWS_AS(resolve_device("tpu"), std::invalid_argument);
    if (!have) {
        CHECK_FALSE(why.empty());
        try {
            resolve_device("cuda");
            FAIL("expected an error");
        } catch (const std::runtime_error& e) {
            CHECK(std::string(e.what()) == "--device cuda: no CUDA device (" + why + ")");
        }
        CHECK_THROWS(ckpt::gpu::encode_chunk_gpu(TensorSetup{}, ChunkIn{}));
        ChunkOut out;
        CHECK_THROWS(backend(Device::Cuda).encode(TensorSetup{}, ChunkIn{}, out));
    } else {
        CHECK(resolve_device("cuda") == Device::Cuda);
    }
}
