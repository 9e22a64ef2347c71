#include "reader.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstring>
#include <new>
#include <optional>
#include <stdexcept>

#include "ckpt/pipeline.h"
#include "codec/backend.h"
#include "common/error.h"
#include "common/file.h"
#include "folder/folder.h"

namespace ckpt::pkg {

namespace {

std::string one_line(std::string s) {
    for (char& c : s)
        if (c == '\n' || c == '\r') c = ' ';
    return s;
}

void set_decode_device(const std::string& name, const std::string& file) {
    try {
        codec::set_decode_device(codec::resolve_device(name));
    } catch (const std::exception& e) {
        throw BadInput(file, e.what());
    }
}

std::vector<std::string> verify_job(const nlohmann::json& req, const Opts& o) {
    const std::string path = req.at("src").get<std::string>();
    const std::optional<std::string> original =
        req.contains("original") && !req["original"].is_null() ? std::optional<std::string>(req["original"].get<std::string>())
                                                               : std::nullopt;
    VerifyOptions v;
    v.grid = o.get<int>("grid", v.grid);
    v.tolerance = o.get<double>("tolerance", v.tolerance);
    v.strict = o.get<bool>("strict", false);
    v.python_names = true;
    if (folder::is_folder(path)) {
        const auto r = folder::verify_folder(path, original, v);
        return {r.json(), r.table(), r.ok ? "1" : "0", r.failures.empty() ? "" : r.failures.front()};
    }
    if (readable_non_hdf5(path))
        throw BadInput(path, "not a ckptkit container; pass the container (.ckz.h5), and the checkpoint as original=");
    v.original = original;
    const Report r = verify(path, v);
    return {r.json(), r.table(), r.ok ? "1" : "0", r.failures.empty() ? "" : r.failures.front()};
}

std::vector<std::string> restore_job(const nlohmann::json& req, const Opts& o) {
    const std::string src = req.at("src").get<std::string>(), dst = req.at("dst").get<std::string>();
    set_decode_device(o.get<std::string>("device", "auto"), src);
    if (folder::is_folder(src)) {
        const auto f = folder::restore_folder(src, dst, RestoreOptions{}, folder_options(o));
        return {f.json(), f.table()};
    }
    check_outputs({src}, {dst}, o.get<bool>("force", false));
    if (readable_non_hdf5(src)) throw BadInput(src, "not a ckptkit container; pass the container (.ckz.h5) that ckpt-compress wrote");
    const Report rep = restore(src, dst, RestoreOptions{});
    return {rep.json(), rep.table()};
}

std::vector<std::string> restore_bytes_job(const nlohmann::json& req, const Opts& o, int memfd) {
    const std::string src = req.at("src").get<std::string>();
    set_decode_device(o.get<std::string>("device", "auto"), src);
    if (req.contains("file")) {   // one original file of a compressed folder (ckptkit.dcp's reader)
        const uint64_t n = folder::restore_folder_file(src, req["file"].get<std::string>(), memfd, RestoreOptions{});
        return {"{}", "", std::to_string(n)};
    }
    if (readable_non_hdf5(src)) throw BadInput(src, "not a ckptkit container");
    const Report rep = restore_to_fd(src, memfd, RestoreOptions{});
    return {rep.json(), rep.table(), std::to_string(rep.file_bytes_out)};
}

void put(std::string& m, uint64_t x) { m.append(reinterpret_cast<const char*>(&x), 8); }

}  // namespace

folder::FolderOptions folder_options(const Opts& o) {
    folder::FolderOptions f;
    f.force = o.get<bool>("force", false);
    f.dcp_unit_bytes = o.get<uint64_t>("dcp_unit_mib", 256) << 20;
    f.dcp_unit_tag = o.get<std::string>("dcp_unit_tag", "");
    f.serial = o.get<bool>("serial", false);
    return f;
}

Failure bad_input(const std::string& tool, const std::string& file, const std::string& why) {
    return {"BadInput", file.empty() ? fmt::format("{}: error: {}", tool, why) : fmt::format("{}: error: {}: {}", tool, file, why),
            file, why};
}

Failure call_job(const char* tool, const std::string& file, const std::function<void()>& job) {
    try {
        job();
    } catch (const BadInput& e) {
        return bad_input(tool, e.file, one_line(e.what()));
    } catch (const CheckFailed& e) {
        std::string w = one_line(e.what());
        if (!file.empty() && w.rfind(file + ": ", 0) == 0) w = w.substr(file.size() + 2);  // name the file once
        return {"CheckFailed", fmt::format("{}: check failed: {}: {}", tool, file, w), file, w};
    } catch (const std::bad_alloc&) {
        return bad_input(tool, file, "out of memory");
    } catch (const std::exception& e) {
        return bad_input(tool, "", one_line(e.what()));
    }
    return {};
}

std::vector<std::string> run_read_job(const nlohmann::json& req, int memfd) {
    const std::string job = req.at("job").get<std::string>();
    const Opts o{req.contains("opts") ? req["opts"] : nlohmann::json::object()};
    if (job == "verify") return verify_job(req, o);
    if (job == "restore") return restore_job(req, o);
    if (job == "restore_bytes") return restore_bytes_job(req, o, memfd);
    throw std::invalid_argument("unknown read job " + job);
}

std::string pack_result(const Failure& f, const std::vector<std::string>& lines, const std::vector<std::string>& outs) {
    std::vector<std::string> v = {f.cls, f.message, f.file, f.reason, std::to_string(lines.size())};
    v.insert(v.end(), lines.begin(), lines.end());
    v.insert(v.end(), outs.begin(), outs.end());
    std::string m;
    put(m, v.size());
    for (const auto& s : v) put(m, s.size()), m += s;
    return m;
}

void unpack_result(const std::string& m, Failure& f, std::vector<std::string>& lines, std::vector<std::string>& outs) {
    std::size_t at = 0;
    auto get = [&]() {
        uint64_t x = 0;
        if (m.size() - at < 8) throw std::runtime_error("the reader's result is cut short");
        std::memcpy(&x, m.data() + at, 8);
        at += 8;
        return x;
    };
    const uint64_t count = get();
    if (count < 5 || count > m.size()) throw std::runtime_error("the reader's result is cut short");
    std::vector<std::string> v(count);
    for (auto& s : v) {
        const uint64_t n = get();
        if (m.size() - at < n) throw std::runtime_error("the reader's result is cut short");
        s.assign(m, at, n);
        at += n;
    }
    f = {v[0], v[1], v[2], v[3]};
    const uint64_t nl = std::stoull(v[4]);
    if (nl > count - 5) throw std::runtime_error("the reader's result is cut short");
    lines.assign(v.begin() + 5, v.begin() + 5 + std::ptrdiff_t(nl));
    outs.assign(v.begin() + 5 + std::ptrdiff_t(nl), v.end());
}

std::vector<std::string> CollectSink::take() {
    std::lock_guard<std::mutex> lock(mutex_);
    std::vector<std::string> out;
    out.swap(lines_);
    return out;
}

void CollectSink::sink_it_(const spdlog::details::log_msg& msg) {
    spdlog::memory_buf_t buf;
    formatter_->format(msg, buf);
    std::string s(buf.data(), buf.size());
    while (!s.empty() && (s.back() == '\n' || s.back() == '\r')) s.pop_back();
    lines_.push_back(std::move(s));
}

std::shared_ptr<CollectSink> collect_logs() {
    auto s = std::make_shared<CollectSink>();
    s->set_pattern("%l: %v");
    spdlog::set_default_logger(std::make_shared<spdlog::logger>("ckptkit", s));
    return s;
}

}  // namespace ckpt::pkg
