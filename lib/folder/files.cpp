// File-tree helpers of folder mode: list, hash, copy, temporary folder, final rename.
#include "folder/files.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fcntl.h>
#include <filesystem>
#include <stdexcept>
#include <sys/stat.h>
#include <unistd.h>

#include "common/cleanup.h"
#include "common/error.h"
#include "common/file.h"
#include "common/xxh3.h"
#include <fmt/format.h>
#include "container/values.h"

#include <cmath>

namespace ckpt::folder {

namespace fs = std::filesystem;

namespace {
constexpr std::size_t kPiece = 1 << 20;

/// Read descriptor for a regular file; BadInput(path) when it cannot be opened.
int open_read(const std::string& path) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) throw BadInput(path, std::string("cannot open: ") + std::strerror(errno));
    return fd;
}

/// Stream a file through `sink(data, n)` while hashing it (with `unit` > 0: also per unit).
template <class Sink> Digest stream_file(const std::string& path, uint64_t unit, Sink&& sink) {
    const int fd = open_read(path);
    Digest d;
    Xxh3State h = make_xxh3(), hu = make_xxh3();
    uint64_t in_unit = 0;   // bytes of the current unit hashed into hu
    std::vector<char> buf(kPiece);
    for (;;) {
        const ssize_t n = ::read(fd, buf.data(), buf.size());
        if (n < 0) {
            if (errno == EINTR) continue;
            const std::string why = std::strerror(errno);
            ::close(fd);
            throw BadInput(path, "read error: " + why);
        }
        if (n == 0) break;
        XXH3_64bits_update(h.get(), buf.data(), std::size_t(n));
        for (uint64_t at = 0; unit && at < uint64_t(n);) {
            const uint64_t k = std::min(uint64_t(n) - at, unit - in_unit);
            XXH3_64bits_update(hu.get(), buf.data() + at, std::size_t(k));
            at += k;
            if ((in_unit += k) == unit) {
                d.units.push_back(XXH3_64bits_digest(hu.get()));
                XXH3_64bits_reset(hu.get());
                in_unit = 0;
            }
        }
        d.size += uint64_t(n);
        try {
            sink(buf.data(), uint64_t(n));
        } catch (...) {
            ::close(fd);
            throw;
        }
    }
    ::close(fd);
    d.xxh3 = XXH3_64bits_digest(h.get());
    if (in_unit) d.units.push_back(XXH3_64bits_digest(hu.get()));
    return d;
}

bool inside(const fs::path& a, const fs::path& b) {  // a is b or below it (canonical paths)
    auto ai = a.begin();
    for (auto bi = b.begin(); bi != b.end(); ++bi, ++ai)
        if (ai == a.end() || *ai != *bi) return false;
    return true;
}
}  // namespace

Tree list_tree(const std::string& root) {
    Tree t;
    std::error_code ec;
    fs::recursive_directory_iterator it(root, fs::directory_options::none, ec), end;
    if (ec) throw BadInput(root, "cannot read folder: " + ec.message());
    for (; it != end; it.increment(ec)) {
        if (ec) throw BadInput(root, "cannot read folder: " + ec.message());
        const std::string rel = fs::relative(it->path(), root).generic_string();
        const auto st = it->symlink_status();
        if (fs::is_symlink(st)) throw BadInput(join(root, rel), "a symbolic link inside the folder; copy or remove it first");
        if (fs::is_directory(st)) t.dirs.push_back(rel);
        else if (fs::is_regular_file(st)) t.files.push_back(rel);
        else throw BadInput(join(root, rel), "not a regular file or folder (socket, fifo or device)");
    }
    std::sort(t.dirs.begin(), t.dirs.end());
    std::sort(t.files.begin(), t.files.end());
    return t;
}

Digest hash_file(const std::string& path, uint64_t unit) {
    return stream_file(path, unit, [](const char*, uint64_t) {});
}

std::vector<uint64_t> hash_units(const std::string& path, uint64_t unit, uint64_t first, uint64_t count) {
    const io::InputFile f(path);
    std::vector<uint64_t> out;
    std::vector<char> buf(kPiece);
    Xxh3State h = make_xxh3();
    for (uint64_t k = first; k < first + count; ++k) {
        const uint64_t begin = k * unit, end = std::min(f.size(), begin + unit);
        if (unit == 0 || begin >= f.size() || begin / unit != k)
            throw BadInput(path, fmt::format("the file ends at byte {}, before its piece {} of {} bytes", f.size(), k, unit));
        XXH3_64bits_reset(h.get());
        for (uint64_t at = begin; at < end;) {
            const std::size_t n = std::size_t(std::min<uint64_t>(buf.size(), end - at));
            f.read_at(at, buf.data(), n, "bytes");
            XXH3_64bits_update(h.get(), buf.data(), n);
            at += n;
        }
        out.push_back(XXH3_64bits_digest(h.get()));
    }
    return out;
}

Digest copy_file(const std::string& src, const std::string& dst, uint64_t unit) {
    try {
        FileWriter w(dst);
        const Digest d = stream_file(src, unit, [&](const char* p, uint64_t n) { w.write(p, n); });
        w.close();
        return d;
    } catch (const BadInput&) {
        throw;
    } catch (const std::exception& e) {
        throw BadInput(dst, e.what());
    }
}

std::string hex64(uint64_t v) {
    char b[17];
    std::snprintf(b, sizeof b, "%016llx", static_cast<unsigned long long>(v));
    return b;
}

uint64_t parse_hex64(const std::string& s) {
    if (s.size() != 16 || s.find_first_not_of("0123456789abcdef") != std::string::npos)
        throw std::invalid_argument("not 16 hex digits: " + s);
    return std::stoull(s, nullptr, 16);
}

std::string join(const std::string& a, const std::string& b) {
    if (a.empty()) return b;
    if (b.empty()) return a;
    return a.back() == '/' ? a + b : a + "/" + b;
}

std::string parent_of(const std::string& rel) {
    const auto s = rel.rfind('/');
    return s == std::string::npos ? "" : rel.substr(0, s);
}

std::string base_of(const std::string& rel) {
    const auto s = rel.rfind('/');
    return s == std::string::npos ? rel : rel.substr(s + 1);
}

double max_abs_storages(const Checkpoint& ck, const io::InputFile& f, const std::string& what) {
    double bound = 0;
    std::vector<uint8_t> buf;
    std::vector<float> vals;
    for (const auto& s : ck.storages) {
        const DType dt = s.dtype;
        const std::size_t es = float_dtype_size(dt);
        if (!es) continue;
        const uint64_t per = kPiece / es;
        for (uint64_t i = 0; i < s.numel; i += per) {
            const std::size_t k = std::size_t(std::min<uint64_t>(per, s.numel - i));
            buf.resize(k * es);
            vals.resize(k);
            f.read_at(s.file_offset + i * es, buf.data(), buf.size(), "tensor");
            bytes_to_float(dt, buf.data(), k, vals.data());
            for (float v : vals) {
                if (!std::isfinite(v)) throw BadInput(f.path(), what + " holds non-finite values: no |theta| bound");
                bound = std::max(bound, double(std::fabs(v)));
            }
        }
    }
    return bound;
}

std::string temp_sibling(const std::string& out, long pid) {
    fs::path p = fs::path(out).lexically_normal();
    if (p.filename().empty()) p = p.parent_path();
    return (p.parent_path() / ("." + p.filename().string() + ".tmp-" + std::to_string(pid))).string();
}

std::string without_trailing_slash(std::string p) {
    while (p.size() > 1 && p.back() == '/') p.pop_back();
    return p;
}

void check_output_folder(const std::string& in, const std::string& out, bool force) {
    std::error_code ec;
    const fs::path ci = fs::weakly_canonical(in, ec);
    const fs::path co = fs::weakly_canonical(out, ec);
    if (inside(co, ci)) throw BadInput(out, "output folder is the input " + in + " or inside it; write it elsewhere");
    if (inside(ci, co)) throw BadInput(out, "the input " + in + " is inside the output folder; write it elsewhere");
    const auto st = fs::status(out, ec);
    if (fs::exists(st)) {
        if (!fs::is_directory(st)) throw BadInput(out, "output exists and is not a folder");
        if (!force) throw BadInput(out, "output already exists; pass --force to overwrite it");
    }
    if (co.has_parent_path() && !fs::is_directory(co.parent_path()))
        throw BadInput(out, "the output's parent folder does not exist");
}

void commit_folder(const std::string& tmp, const std::string& out) {
    try {
        fsync_path(tmp);
        std::error_code ec;
        if (fs::exists(fs::symlink_status(out, ec))) {
            if (::renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, out.c_str(), RENAME_EXCHANGE) == 0) {
                fs::remove_all(tmp);   // now the old output
            } else {
                // no atomic exchange on this file system: move the old one aside first
                const std::string old = tmp + ".old";
                if (::rename(out.c_str(), old.c_str()) != 0) throw std::runtime_error(std::strerror(errno));
                if (::rename(tmp.c_str(), out.c_str()) != 0) throw std::runtime_error(std::strerror(errno));
                fs::remove_all(old);
            }
        } else if (::rename(tmp.c_str(), out.c_str()) != 0) {
            throw std::runtime_error(std::strerror(errno));
        }
        temp_forget(tmp);  // (after the exchange, tmp held the old output: removed above)
        const fs::path parent = fs::path(out).lexically_normal().parent_path();
        fsync_path(parent.empty() ? "." : parent.string());
    } catch (const std::exception& e) {
        throw BadInput(out, std::string("cannot rename the finished folder into place: ") + e.what());
    }
}

}  // namespace ckpt::folder
