#include "io/torch_file.h"

#include <cstring>
#include <unordered_map>
#include <unordered_set>

#include <fmt/format.h>

#include "common/error.h"
#include "io/detail.h"
#include "io/pickle.h"
#include "io/zip.h"

namespace ckpt::io {
namespace {

/// Assign '/'-joined paths to the tensors reachable from the root (first path wins, in the
/// order of Value::for_each_child, so tensors held by opaque objects get "@args"/"@state"
/// segments); renumbers Value::Tensor indices to the reachable tensors in `out`.
void walk(Value& v, const std::string& path, const std::vector<PickleTensor>& in, std::vector<long>& map,
          std::vector<TensorInfo>& out) {
    if (auto t = std::get_if<Value::Tensor>(&v.v)) {
        if (map[t->index] < 0) {
            const PickleTensor& p = in[t->index];
            TensorInfo ti;
            ti.path = path;
            ti.storage = p.storage;
            ti.dtype = p.dtype;
            ti.shape = p.shape;
            ti.stride = p.stride;
            ti.storage_offset = p.storage_offset;
            map[t->index] = static_cast<long>(out.size());
            out.push_back(std::move(ti));
        }
        t->index = static_cast<std::size_t>(map[t->index]);
        return;
    }
    v.for_each_child([&](const std::string& k, Value& child) {
        walk(child, path.empty() ? k : path + "/" + k, in, map, out);
    });
}

/// Build the format-neutral checkpoint from an unpickled object; `where` gives the file
/// offset and CRC fields of each PickleResult storage (same order).
Checkpoint from_pickle(PickleResult&& pr, Format fmt_, const std::vector<std::pair<uint64_t, std::vector<uint64_t>>>& where) {
    Checkpoint ck;
    ck.format = fmt_;
    for (std::size_t i = 0; i < pr.storages.size(); ++i) {
        const auto& ps = pr.storages[i];
        StorageInfo s;
        s.key = ps.key;
        s.dtype = ps.dtype;
        s.numel = ps.numel;
        s.nbytes = ps.numel * dtype_size(ps.dtype);   // overflow checked by the callers
        s.file_offset = where[i].first;
        s.crc_offsets = where[i].second;
        ck.storages.push_back(std::move(s));
    }
    std::vector<long> map(pr.tensors.size(), -1);
    walk(pr.root, "", pr.tensors, map, ck.tensors);
    ck.root = std::move(pr.root);
    return ck;
}

uint64_t storage_bytes(const InputFile& f, const PickleStorage& s) {
    auto nb = checked_mul(s.numel, dtype_size(s.dtype));
    if (!nb) throw BadInput(f.path(), fmt::format("storage '{}' size {} x {} overflows", s.key, s.numel, dtype_name(s.dtype)));
    return *nb;
}

// Pickled legacy magic number: PROTO n, LONG1 10 bytes of 0x1950a86a20f9469cfc6c, STOP.
constexpr uint8_t kMagic[10] = {0x6c, 0xfc, 0x9c, 0x46, 0xf9, 0x20, 0x6a, 0xa8, 0x50, 0x19};

}  // namespace

Checkpoint read_torch_zip(const InputFile& f, const Limits& limits) {
    ZipArchive zip = read_zip(f, limits);
    if (zip.entries.empty()) throw BadInput(f.path(), "zip archive has no entries");
    const std::string& first = zip.entries.front().name;
    auto slash = first.find('/');
    if (slash == std::string::npos || slash == 0)
        throw BadInput(f.path(), fmt::format("first zip entry '{}' is not inside an archive folder", first));
    const std::string prefix = first.substr(0, slash);
    if (const ZipEntry* bo = zip.find(prefix + "/byteorder")) {
        std::string order = f.read_string(bo->data_offset, std::min<uint64_t>(bo->size, 16), "byteorder record");
        if (order != "little")
            throw BadInput(f.path(), fmt::format("byteorder record says '{}'; only little-endian files are supported",
                                                 order.substr(0, 8)));
    }
    const ZipEntry* pkl = zip.find(prefix + "/data.pkl");
    if (!pkl) throw BadInput(f.path(), fmt::format("zip has no '{}/data.pkl' record", prefix));
    if (pkl->size > limits.max_pickle_bytes)
        throw BadInput(f.path(), fmt::format("data.pkl is {} bytes, more than the limit {}", pkl->size, limits.max_pickle_bytes));
    RangeReader rd(f, pkl->data_offset, pkl->data_offset + pkl->size);
    PickleResult pr = unpickle(rd, limits, PersistentIds::TorchZip);
    if (rd.remaining() != 0)
        throw BadInput(f.path(), fmt::format("{} bytes follow the STOP opcode in data.pkl", rd.remaining()));
    std::vector<std::pair<uint64_t, std::vector<uint64_t>>> where;
    for (const auto& s : pr.storages) {
        std::string name = prefix + "/data/" + s.key;
        const ZipEntry* e = zip.find(name);
        if (!e) throw BadInput(f.path(), fmt::format("storage record '{}' is missing", name));
        uint64_t nb = storage_bytes(f, s);
        if (e->size != nb)
            throw BadInput(f.path(), fmt::format("storage record '{}' has {} bytes, expected {} ({} x {})", name,
                                                 e->size, nb, s.numel, dtype_name(s.dtype)));
        where.emplace_back(e->data_offset, e->crc_offsets);
    }
    return from_pickle(std::move(pr), Format::TorchZip, where);
}

bool is_torch_legacy(const InputFile& f) {
    uint8_t h[15];
    if (f.size() < sizeof h) return false;
    f.read_at(0, h, sizeof h, "file header");
    return h[0] == 0x80 && h[2] == 0x8a && h[3] == 10 && std::memcmp(h + 4, kMagic, 10) == 0 && h[14] == '.';
}

Checkpoint read_torch_legacy(const InputFile& f, const Limits& limits) {
    auto bad = [&](const std::string& m) { return BadInput(f.path(), "legacy torch file: " + m); };
    RangeReader rd(f, 0, f.size());
    unpickle(rd, limits, PersistentIds::None);   // magic number (checked by is_torch_legacy)
    PickleResult proto = unpickle(rd, limits, PersistentIds::None);
    auto p = std::get_if<int64_t>(&proto.root.v);
    if (!p || *p != 1001) throw bad("protocol version is not 1001");
    PickleResult sys = unpickle(rd, limits, PersistentIds::None);
    const Value* le = sys.root.get("little_endian");
    if (!le || !std::holds_alternative<bool>(le->v)) throw bad("sys_info has no little_endian flag");
    if (!std::get<bool>(le->v)) throw bad("big-endian files are not supported");
    PickleResult pr = unpickle(rd, limits, PersistentIds::TorchLegacy);
    PickleResult keys = unpickle(rd, limits, PersistentIds::None);
    auto kl = std::get_if<Value::List>(&keys.root.v);
    if (!kl) throw bad("storage key list is not a list");
    std::unordered_map<std::string, std::size_t> index;
    for (std::size_t i = 0; i < pr.storages.size(); ++i) index.emplace(pr.storages[i].key, i);
    std::vector<std::pair<uint64_t, std::vector<uint64_t>>> where(pr.storages.size());
    std::unordered_set<std::string> seen;
    uint64_t pos = rd.position();
    for (const auto& kv : *kl) {
        auto k = std::get_if<std::string>(&kv.v);
        if (!k) throw bad("storage key is not a str");
        auto it = index.find(*k);
        if (it == index.end()) throw bad(fmt::format("storage key '{}' is not used by any tensor", *k));
        if (!seen.insert(*k).second) throw bad(fmt::format("storage key '{}' listed twice", *k));
        const PickleStorage& s = pr.storages[it->second];
        uint64_t numel = f.u64(pos, "legacy storage size");
        if (numel != s.numel)
            throw bad(fmt::format("storage '{}' at offset {} has {} elements, the pickle says {}", *k, pos, numel, s.numel));
        uint64_t nb = storage_bytes(f, s);
        if (!f.contains(pos + 8, nb))
            throw bad(fmt::format("storage '{}' ({} bytes at offset {}) runs past end of file ({} bytes)", *k, nb,
                                  pos + 8, f.size()));
        where[it->second] = {pos + 8, {}};
        pos += 8 + nb;
    }
    if (seen.size() != pr.storages.size()) throw bad("a storage used by a tensor is missing from the key list");
    if (pos != f.size()) throw bad(fmt::format("{} unexpected bytes after the last storage", f.size() - pos));
    return from_pickle(std::move(pr), Format::TorchLegacy, where);
}

}  // namespace ckpt::io
