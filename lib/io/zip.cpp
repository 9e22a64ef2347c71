#include "io/zip.h"

#include <algorithm>
#include <cstring>
#include <unordered_map>

#include <fmt/format.h>

#include "common/error.h"

namespace ckpt::io {
namespace {

constexpr uint32_t kEocdSig = 0x06054b50;
constexpr uint32_t kZ64LocSig = 0x07064b50;
constexpr uint32_t kZ64EocdSig = 0x06064b50;
constexpr uint32_t kCentralSig = 0x02014b50;
constexpr uint32_t kLocalSig = 0x04034b50;
constexpr uint32_t kDescriptorSig = 0x08074b50;
constexpr uint64_t kEocdSize = 22, kZ64LocSize = 20, kZ64EocdSize = 56;
constexpr uint64_t kCentralSize = 46, kLocalSize = 30;

uint32_t le32(const uint8_t* p) {
    return uint32_t(p[0]) | (uint32_t(p[1]) << 8) | (uint32_t(p[2]) << 16) | (uint32_t(p[3]) << 24);
}
uint16_t le16(const uint8_t* p) { return static_cast<uint16_t>(p[0] | (p[1] << 8)); }
uint64_t le64(const uint8_t* p) { return uint64_t(le32(p)) | (uint64_t(le32(p + 4)) << 32); }

/// Offset of the end-of-central-directory record whose comment ends exactly at end of file.
std::optional<uint64_t> find_eocd(const InputFile& f) {
    if (f.size() < kEocdSize) return std::nullopt;
    uint64_t tail = std::min<uint64_t>(f.size(), 0xFFFF + kEocdSize);
    uint64_t base = f.size() - tail;
    std::string buf = f.read_string(base, tail, "zip end record");
    auto* p = reinterpret_cast<const uint8_t*>(buf.data());
    for (uint64_t i = tail - kEocdSize + 1; i-- > 0;) {
        if (le32(p + i) == kEocdSig && i + kEocdSize + le16(p + i + 20) == tail) return base + i;
    }
    return std::nullopt;
}

BadInput bad(const InputFile& f, const std::string& msg) { return BadInput(f.path(), msg); }

/// Where the central directory lies, from the end records: `count` records of `size` bytes
/// at `offset` (relative to the archive), the archive's absolute `start` (bytes prepended to
/// the zip), and `end_limit`, the absolute offset the directory must end before.
struct CentralDir {
    uint64_t count = 0, size = 0, offset = 0, start = 0, end_limit = 0;
    uint64_t abs() const { return start + offset; }   ///< absolute offset of the directory
};

/// The ZIP64 end record that the locator before `eocd` names: count, size and offset of
/// the directory (replacing the 16-bit fields) and the archive start.
void read_zip64_end(const InputFile& f, uint64_t eocd, CentralDir& d) {
    uint64_t loc = eocd - kZ64LocSize;
    uint8_t l[kZ64LocSize];
    f.read_at(loc, l, kZ64LocSize, "zip64 locator");
    uint64_t rel = le64(l + 8);
    uint64_t rec;
    if (loc >= kZ64EocdSize && f.u32(loc - kZ64EocdSize, "zip64 end record") == kZ64EocdSig)
        rec = loc - kZ64EocdSize;   // standard position, directly before the locator
    else if (rel < loc && f.contains(rel, kZ64EocdSize) && f.u32(rel, "zip64 end record") == kZ64EocdSig)
        rec = rel;
    else
        throw bad(f, fmt::format("zip64 end record offset {} does not point at a zip64 end record", rel));
    if (rec < rel) throw bad(f, fmt::format("zip64 end record offset {} lies past its position {}", rel, rec));
    d.start = rec - rel;
    uint8_t r[kZ64EocdSize];
    f.read_at(rec, r, kZ64EocdSize, "zip64 end record");
    if (le32(r + 16) != 0 || le32(r + 20) != 0) throw bad(f, "multi-disk zip archives are not supported");
    d.count = le64(r + 32);
    d.size = le64(r + 40);
    d.offset = le64(r + 48);
    d.end_limit = rec;
}

/// Step 1: the (ZIP64) end records, checked: one disk, at most limits.max_zip_entries
/// records, a directory that lies before its end record and can hold them.
CentralDir read_end_records(const InputFile& f, const Limits& limits) {
    auto eocd_opt = find_eocd(f);
    if (!eocd_opt) throw bad(f, "no zip end-of-central-directory record found (not a zip file or truncated)");
    const uint64_t eocd = *eocd_opt;

    uint8_t e[kEocdSize];
    f.read_at(eocd, e, kEocdSize, "zip end record");
    if (le16(e + 4) != 0 || le16(e + 6) != 0) throw bad(f, "multi-disk zip archives are not supported");
    CentralDir d;
    d.count = le16(e + 10);
    d.size = le32(e + 12);
    d.offset = le32(e + 16);
    d.end_limit = eocd;   // the central directory must end before this absolute offset

    bool z64 = eocd >= kZ64LocSize && f.u32(eocd - kZ64LocSize, "zip64 locator") == kZ64LocSig;
    if (z64) {
        read_zip64_end(f, eocd, d);
    } else {
        if (d.size > eocd || d.offset > eocd - d.size)
            throw bad(f, fmt::format("zip central directory (offset {}, {} bytes) runs past its end record at {}",
                                     d.offset, d.size, eocd));
        d.start = eocd - d.size - d.offset;
    }
    if (d.count > limits.max_zip_entries)
        throw bad(f, fmt::format("zip has {} entries, more than the limit {}", d.count, limits.max_zip_entries));
    if (d.offset > d.end_limit - d.start || d.size > d.end_limit - d.start - d.offset)
        throw bad(f, fmt::format("zip central directory (offset {}, {} bytes) runs past its end record at {}",
                                 d.offset, d.size, d.end_limit));
    if (d.size < d.count * kCentralSize)
        throw bad(f, fmt::format("zip central directory of {} bytes cannot hold {} entries", d.size, d.count));
    return d;
}

/// One central-directory record as read: the entry (name, flags, CRC, size) and what
/// locating its data needs.
struct CentralRecord {
    ZipEntry ent;
    uint64_t rec_abs = 0;    ///< absolute offset of the record
    uint64_t local = 0;      ///< local header offset, relative to the archive
    uint64_t name_len = 0;
};

/// ZIP64 extended information (extra field 0x0001): the 0xFFFFFFFF fields follow, in this order.
void apply_zip64_extra(const InputFile& f, const std::string& name, const std::string& extra, uint64_t& usize,
                       uint64_t& csize, uint64_t& local, uint32_t& disk) {
    const uint64_t extra_len = extra.size();
    const auto* x = reinterpret_cast<const uint8_t*>(extra.data());
    for (uint64_t k = 0; k + 4 <= extra_len;) {
        uint16_t id = le16(x + k), len = le16(x + k + 2);
        if (k + 4 + len > extra_len)
            throw bad(f, fmt::format("zip entry '{}' has a malformed extra field", name));
        if (id == 0x0001) {
            const uint8_t* d = x + k + 4;
            uint64_t used = 0;
            auto take = [&](uint64_t& v) {
                if (used + 8 > len) throw bad(f, fmt::format("zip entry '{}' has a short zip64 extra field", name));
                v = le64(d + used);
                used += 8;
            };
            if (usize == 0xFFFFFFFF) take(usize);
            if (csize == 0xFFFFFFFF) take(csize);
            if (local == 0xFFFFFFFF) take(local);
            if (disk == 0xFFFF && used + 4 <= len) disk = le32(d + used);
        }
        k += 4 + len;
    }
}

/// Step 2, per record: read record i, checked: one disk, not encrypted, stored, equal sizes.
CentralRecord read_central_record(const InputFile& f, RangeReader& cdr, uint64_t i) {
    CentralRecord r;
    r.rec_abs = cdr.position();
    uint8_t h[kCentralSize];
    if (cdr.remaining() < kCentralSize)
        throw bad(f, fmt::format("zip central directory record {} at offset {} is malformed", i, r.rec_abs));
    cdr.read(h, kCentralSize, "zip central directory");
    if (le32(h) != kCentralSig)
        throw bad(f, fmt::format("zip central directory record {} at offset {} is malformed", i, r.rec_abs));
    ZipEntry& ent = r.ent;
    ent.flags = le16(h + 8);
    uint16_t method = le16(h + 10);
    ent.crc32 = le32(h + 16);
    uint64_t csize = le32(h + 20), usize = le32(h + 24);
    uint64_t name_len = le16(h + 28), extra_len = le16(h + 30), comment_len = le16(h + 32);
    r.local = le32(h + 42);
    uint32_t disk = le16(h + 34);
    if (cdr.remaining() < name_len + extra_len + comment_len)
        throw bad(f, fmt::format("zip central directory record {} at offset {} runs past the directory", i, r.rec_abs));
    ent.name = cdr.string(name_len, "zip central directory");
    const std::string extra = cdr.string(extra_len, "zip central directory");
    cdr.string(comment_len, "zip central directory");
    apply_zip64_extra(f, ent.name, extra, usize, csize, r.local, disk);
    if (disk != 0) throw bad(f, fmt::format("zip entry '{}' lies on another disk", ent.name));
    if (ent.flags & 1) throw bad(f, fmt::format("zip entry '{}' is encrypted", ent.name));
    if (method != 0)
        throw bad(f, fmt::format("zip entry '{}' is compressed (method {}); torch.save writes stored entries only",
                                 ent.name, method));
    if (csize != usize)
        throw bad(f, fmt::format("zip entry '{}' is stored but its sizes differ ({} vs {})", ent.name, csize, usize));
    ent.size = usize;
    r.name_len = name_len;
    return r;
}

/// Step 3, per record: its local header (data starts after the header's own name and extra
/// field; the name must match) and the offsets of its CRC-32 fields.
void locate_data(const InputFile& f, const CentralDir& cd, CentralRecord& r) {
    ZipEntry& ent = r.ent;
    const uint64_t cd_abs = cd.abs();
    if (r.local > cd.offset || kLocalSize > cd.offset - r.local)
        throw bad(f, fmt::format("zip entry '{}' local header offset {} lies outside the archive", ent.name, r.local));
    ent.header_offset = cd.start + r.local;
    // the fixed part and, when the file holds it, the name the central record gives, in
    // one read (one system call per entry: files of 10^5 tensors have 10^5 entries)
    std::string head(kLocalSize + (f.contains(ent.header_offset, kLocalSize + r.name_len) ? r.name_len : 0), '\0');
    f.read_at(ent.header_offset, head.data(), head.size(), "zip local header");
    const auto* lh = reinterpret_cast<const uint8_t*>(head.data());
    if (le32(lh) != kLocalSig)
        throw bad(f, fmt::format("zip entry '{}': no local header at offset {}", ent.name, ent.header_offset));
    if (le16(lh + 8) != 0)
        throw bad(f, fmt::format("zip entry '{}' is compressed in its local header", ent.name));
    uint64_t lname = le16(lh + 26), lextra = le16(lh + 28);
    ent.data_offset = ent.header_offset + kLocalSize + lname + lextra;
    if (ent.data_offset > cd_abs || ent.size > cd_abs - ent.data_offset)
        throw bad(f, fmt::format("zip entry '{}' data (offset {}, {} bytes) runs into the central directory at {}",
                                 ent.name, ent.data_offset, ent.size, cd_abs));
    if (lname != r.name_len || head.size() != kLocalSize + lname || head.compare(kLocalSize, lname, ent.name) != 0)
        throw bad(f, fmt::format("zip entry '{}': local header name differs from the central directory", ent.name));

    if (!(ent.flags & 8)) {
        ent.crc_offsets.push_back(ent.header_offset + 14);
    } else {
        uint64_t d = ent.data_offset + ent.size;
        uint32_t first = f.u32(d, "zip data descriptor");
        bool sig = first == kDescriptorSig &&
                   (ent.crc32 != kDescriptorSig || f.u32(d + 4, "zip data descriptor") == ent.crc32);
        uint64_t at = sig ? d + 4 : d;
        if (!f.contains(at, 4) || at + 4 > cd_abs)
            throw bad(f, fmt::format("zip entry '{}' data descriptor runs into the central directory", ent.name));
        ent.crc_offsets.push_back(at);
    }
    ent.crc_offsets.push_back(r.rec_abs + 16);
}

/// Step 4: entries must not share bytes: each one's data ends before the next local header.
void check_no_overlap(const InputFile& f, const ZipArchive& zip) {
    std::vector<const ZipEntry*> order;
    for (const auto& ent : zip.entries) order.push_back(&ent);
    std::sort(order.begin(), order.end(),
              [](const ZipEntry* a, const ZipEntry* b) { return a->header_offset < b->header_offset; });
    auto end = [](const ZipEntry* e) {   // last byte + 1, including a data descriptor's CRC
        uint64_t data_end = e->data_offset + e->size;
        return (e->flags & 8) ? std::max(data_end, e->crc_offsets.front() + 4) : data_end;
    };
    for (std::size_t i = 1; i < order.size(); ++i)
        if (end(order[i - 1]) > order[i]->header_offset)
            throw bad(f, fmt::format("zip entries '{}' and '{}' overlap", order[i - 1]->name, order[i]->name));
}

}  // namespace

const ZipEntry* ZipArchive::find(const std::string& name) const {
    const std::size_t i = index.find(name, [&](std::size_t k) -> const std::string& { return entries[k].name; });
    return i == NameIndex::npos ? nullptr : &entries[i];
}

bool has_zip_eocd(const InputFile& f) { return find_eocd(f).has_value(); }

ZipArchive read_zip(const InputFile& f, const Limits& limits) {
    const CentralDir cd = read_end_records(f, limits);
    ZipArchive zip;
    zip.archive_start = cd.start;
    zip.entries.reserve(cd.count);  // count is checked against the directory size (and the file) above
    zip.index.reserve(cd.count);
    // Streamed record by record: memory stays bounded whatever cd.size claims.
    RangeReader cdr(f, cd.abs(), cd.abs() + cd.size);
    for (uint64_t i = 0; i < cd.count; ++i) {
        CentralRecord r = read_central_record(f, cdr, i);
        const std::size_t at = zip.entries.size();
        if (zip.index.insert(r.ent.name, at, [&](std::size_t k) -> const std::string& { return zip.entries[k].name; }) != at)
            throw bad(f, fmt::format("zip entry '{}' appears twice", r.ent.name));
        locate_data(f, cd, r);
        zip.entries.push_back(std::move(r.ent));
    }
    check_no_overlap(f, zip);
    return zip;
}

}  // namespace ckpt::io
