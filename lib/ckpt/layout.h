// Which storages of a checkpoint become codes, and under which guarantee: the one plan
// that ckpt-compress writes into the manifest and ckpt-verify re-derives from the source
// bytes kept in the container (so a manifest that disagrees with the checkpoint's own
// param_groups, step or parameter mapping fails verification).
#pragma once
#include <string>
#include <vector>

#include "ckpt/optimizer.h"
#include "ckpt/pipeline.h"
#include "ckpt/report.h"
#include "container/manifest.h"
#include "io/file.h"

namespace ckpt {

/// The plan of one checkpoint: the manifest's storages and params (everything except the
/// stream offsets, escapes and bounds that encoding fills in), the rows of states kept
/// exact, and per param the HyperKey bits its file states.
struct Layout {
    /// Where a coded parameter's theta lies in the source (a whole float storage of its
    /// size), whether or not its certificate needs it: the report counts the coordinates in
    /// the ulp regime from it. storage -1: the file holds no such parameter.
    struct ThetaAt {
        int64_t storage = -1;
        DType dtype = DType::F32;
    };
    container::Manifest man;
    std::vector<ThetaAt> theta;       ///< per man.params entry
    std::vector<TensorRow> kept;      ///< states kept exact, with the reason in `note`
    std::vector<unsigned> stated;     ///< per man.params entry
};

/// Plan `ck` (read from `f`) under the options. Reads the parameter values of ambiguous
/// Adam-L2 mappings (max finite |theta| over the candidates; one with no finite value, a
/// causal mask of -inf, is no candidate). Throws BadInput when the Adam L2
/// domain needs a parameter that cannot be found (and no --param-bound), when the parameter
/// storage is also a moment, or when an override contradicts the file.
Layout plan_layout(const Checkpoint& ck, const io::InputFile& f, const CompressOptions& o);

/// Compare a stored manifest with the plan re-derived from its source; returns one line
/// per disagreement (empty when they agree): sizes, the storage of every moment and of
/// theta (binding each stream to its parameter), step, the gradient domain, and the
/// hyper-parameters the source states. Names are for reports and not compared.
std::vector<std::string> compare_layout(const container::Manifest& stored, const Layout& derived);

}  // namespace ckpt
