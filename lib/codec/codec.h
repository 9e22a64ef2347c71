// Codec selection and the per-chunk encode/certify/decode loop shared by ckpt-compress,
// ckpt-verify and ckpt-restore. One parameter tensor's moments are processed in chunks of
// whole blocks; a coordinate keeps its codes only if every moment has a code and the
// guard certifies it (guard.h); otherwise all its moments go exactly to the escape table.
#pragma once
#include <array>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "codec/guard.h"
#include "codec/log8.h"

namespace ckpt::codec {

/// The codecs: vlog (default, variable rate, entropy-coded; container format 2), log8 (fixed
/// 8 bits), and the baselines bf16 and blockwise8.
enum class Kind { Log8, BF16, Blockwise8, VLog };
Kind kind_from_name(const std::string&);   ///< throws std::invalid_argument
const char* kind_name(Kind);
int code_bytes(Kind);                       ///< bytes per moment value (before entropy coding)
/// Whether the container entropy-codes the codes in segments (codec/rans.h): vlog.
bool entropy_coded(Kind);
int params_per_block(Kind);                 ///< int32 per block and moment

/// Values per block (one set of block parameters per moment and block).
constexpr int kBlock = 64;
/// Values per entropy-coded segment (a whole number of blocks; segments of one parameter
/// start at its coordinate 0 and decode independently of each other).
constexpr int kSegment = 16384;

/// Why a coordinate escaped: a moment had no code (outside what its block parameters
/// reach), the certificate was above the tolerance, or a moment was not finite.
enum class EscapeCause : int { NoCode = 0, Certificate = 1, NonFinite = 2 };

/// Storage element type of a moment: FP32, or low precision when params are.
enum class MomentType { F32, F16, BF16 };
/// Round a decoded value to the moment's storage type (what torch will see).
double round_to(MomentType, double);

/// How the gradient domain of each coordinate is formed (docs/design.md §1).
struct DomainRule {
    double grad_bound = 1.0;   ///< G, may be +inf
    bool l2 = false;           ///< include the Adam L2 shift wd*theta
    bool plain = true;         ///< include the unshifted [-G, G] (AdamW, or unknown kind)
    double weight_decay = 0;
    double theta_bound = 0;    ///< |theta| <= theta_bound when l2 and no theta is given
};

/// Gradient domain [lo, hi] of coordinate i (theta may be null), widened by 1e-6
/// relative for the FP32 rounding of grad + wd*theta in torch.
void gradient_domain(const DomainRule&, const float* theta, std::size_t i, double& lo, double& hi);

/// One chunk of a parameter's moments, as float, n values each. vmax/theta may be null.
struct ChunkIn {
    const float* m = nullptr;
    const float* v = nullptr;
    const float* vmax = nullptr;
    const float* theta = nullptr;   ///< needed only when DomainRule::l2 and G finite
    std::size_t n = 0;
};

/// Encoded chunk: codes and block params per moment, escaped coordinates (chunk-local
/// indices), and the largest certificate among kept coordinates (lr units).
struct ChunkOut {
    std::array<std::vector<uint8_t>, 3> codes;     ///< n * code_bytes each
    std::array<std::vector<int16_t>, 3> params;    ///< blocks * params_per_block each
    std::vector<uint32_t> escapes;                 ///< chunk-local coordinate indices
    std::array<uint64_t, 3> causes{};              ///< escapes per EscapeCause
    double max_bound = 0;
};

/// Settings shared by every chunk of one parameter tensor.
struct TensorSetup {
    Kind kind = Kind::Log8;
    AdamHyper hyper;
    double tolerance = 0.01;
    DomainRule domain;
    MomentType type = MomentType::F32;
    /// The rules container format 6 added (false: as formats 1-5 decode and certify):
    /// exp_avg's unit where the denominator state decodes to exactly 0 (an exp_avg_sq that
    /// underflowed while exp_avg did not) is 2^-75 times the block's step, not 0 (block.h
    /// m_scale), and the every-update certificate's exp_avg_sq term also takes its eps-bound
    /// form (guard.h closed_all), which matters where sqrt(v) << eps.
    bool format6 = true;
    CKPT_HD int moments() const { return hyper.amsgrad ? 3 : 2; }
};

/// CPU threads that encode_chunk / decode_chunk split a chunk's blocks over (contiguous
/// block ranges; output identical for any count). Default: the cores this process may run
/// on (sched_getaffinity, so taskset applies). n = 0 restores the default.
void set_cpu_threads(unsigned n);
unsigned cpu_threads();

/// The instruction-set level the CPU block loops (encode_chunk, decode_chunk) are compiled
/// for: x86-64's baseline (SSE2), AVX2 or AVX-512 (F, DQ, BW, VL); Baseline elsewhere. The
/// results are identical at every level (IEEE operations in source order, no FMA
/// contraction: -ffp-contract=off); only the speed differs (docs/design.md §4).
enum class Isa { Baseline, AVX2, AVX512 };
const char* isa_name(Isa);
/// Whether this CPU runs level `i`.
bool isa_supported(Isa i);
/// The level in use: the best this CPU supports, or the CKPTKIT_ISA environment variable
/// (baseline, avx2, avx512) when set; std::invalid_argument for another value or a level
/// this CPU lacks.
Isa active_isa();
/// Use level i from now on (tests, benchmarks); std::invalid_argument when unsupported.
void set_isa(Isa i);

/// Run fn(part, begin, end) over contiguous ranges of [0, n), one per CPU thread (at most
/// one per 16k items; part 0 on the calling thread); rethrows the first exception.
void parallel_ranges(std::size_t n, const std::function<void(unsigned, std::size_t, std::size_t)>& fn);
/// The number of ranges parallel_ranges(n, ...) uses.
unsigned parallel_parts(std::size_t n);
/// Run fn(part, begin, end) over contiguous ranges of [0, count) items of coarse work (whole
/// entropy-coded segments): one range per CPU thread, up to one item each; part 0 on the
/// calling thread; rethrows the first exception.
void parallel_items(std::size_t count, const std::function<void(unsigned, std::size_t, std::size_t)>& fn);

/// The first of `blocks` blocks whose parameters (params_per_block each) for moment k
/// (0 exp_avg, 1 exp_avg_sq, 2 max_exp_avg_sq) are outside the format, or SIZE_MAX; *rule
/// (when given) then says what the format requires (formats/container.md): log8's
/// exp_avg_sq / max_exp_avg_sq steps and vlog's exp_avg_sq steps >= 1 (a step <= 0 would
/// decode every code of the block to one value with a zero-width cell); the parameters the
/// format reserves as 0 (log8's and vlog's exp_avg second parameter, vlog's
/// max_exp_avg_sq pair, which uses exp_avg_sq's grid) 0; vlog's anchor and exp_avg
/// exponent in [-32767, 32767] (the encoder's range); blockwise8's absmax a finite float
/// >= +0.
std::size_t invalid_block_param(Kind kind, int k, const int16_t* params, std::size_t blocks,
                                const char** rule = nullptr);

/// Encode and certify one chunk (n need not be a multiple of kBlock only for the last).
ChunkOut encode_chunk(const TensorSetup&, const ChunkIn&);
/// The same into `out`, reusing its buffers (a pipeline's per-chunk output: no allocation
/// or zero-fill on the calling thread once they have grown; every byte is written).
void encode_chunk_into(const TensorSetup&, const ChunkIn&, ChunkOut& out);

/// Fill out.causes for an encoding made elsewhere (the GPU path): re-runs the CPU block
/// encoder on the blocks that hold escapes (the same math, so the same trial).
void classify_escapes(const TensorSetup&, const ChunkIn&, ChunkOut& out);

/// Decode codes (escapes not yet applied) into out[role][i]; returns, per coordinate,
/// its re-derived certificate in `bounds` when non-null (verify's path). Returns the first
/// block (chunk-local) holding a used code (one that stands for a value other than an exact
/// zero) that decodes outside the float range (to 0 or inf, or to an empty or reversed
/// cell: block.h code_in_range), or SIZE_MAX. Only corrupted or forged block parameters
/// make one (the encoders never write one); the container reader refuses the container
/// then. Everything is decoded either way.
std::size_t decode_chunk(const TensorSetup&, const std::array<const uint8_t*, 3>& codes,
                         const std::array<const int16_t*, 3>& params, std::size_t n,
                         std::array<float*, 3> out, const float* theta, double* bounds);

}  // namespace ckpt::codec
