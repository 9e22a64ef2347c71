// ckptkit._ckptkit: the Python package's bindings over the library the tools call
// (lib/ckpt/pipeline.h, lib/folder/folder.h, lib/replay/job.h); the package's Python side (ckptkit/__init__.py)
// checks the options and shapes the results. Every call releases the GIL around the C++
// work and holds one process-wide lock meanwhile (libhdf5 is not thread-safe: one job at a
// time). Library errors become the package's exceptions with the CLI's one-line message:
// BadInput -> ckptkit.BadInput ("TOOL: error: FILE: what"), CheckFailed ->
// ckptkit.CheckFailed ("TOOL: check failed: FILE: what"). Warnings the library logs
// (spdlog) are collected per call and handed back with the report.
#include <nlohmann/json.hpp>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <spdlog/sinks/base_sink.h>
#include <spdlog/spdlog.h>

#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <new>
#include <optional>
#include <string>
#include <vector>

#include "folder/folder.h"
#include "ckpt/pipeline.h"
#include "codec/codec.h"
#include "common/error.h"
#include "common/file.h"
#include "common/isolate.h"
#include "common/cleanup.h"
#include "container/h5.h"
#include "codec/backend.h"
#include "io/checkpoint.h"
#include "io/file.h"
#include "replay/job.h"

namespace py = pybind11;
using namespace ckpt;

namespace {

/// One library job at a time (libhdf5 is not thread-safe; set_cpu_threads is global).
std::mutex& job_mutex() {
    static std::mutex m;
    return m;
}

/// spdlog sink gathering the lines logged during one job (under job_mutex).
class CollectSink final : public spdlog::sinks::base_sink<std::mutex> {
public:
    std::vector<std::string> take() {
        std::lock_guard<std::mutex> lock(mutex_);
        std::vector<std::string> out;
        out.swap(lines_);
        return out;
    }

protected:
    void sink_it_(const spdlog::details::log_msg& msg) override {
        spdlog::memory_buf_t buf;
        formatter_->format(msg, buf);
        std::string s(buf.data(), buf.size());
        while (!s.empty() && (s.back() == '\n' || s.back() == '\r')) s.pop_back();
        lines_.push_back(std::move(s));
    }
    void flush_() override {}

private:
    std::vector<std::string> lines_;
};

std::shared_ptr<CollectSink>& sink() {
    static std::shared_ptr<CollectSink> s;
    return s;
}

std::string one_line(std::string s) {
    for (char& c : s)
        if (c == '\n' || c == '\r') c = ' ';
    return s;
}

/// What a failed job raises in Python.
struct Failure {
    const char* cls = nullptr;   ///< "BadInput" | "CheckFailed" | nullptr (none)
    std::string message, file, reason;
};

/// Run `job` (no GIL, under job_mutex) and say what it raised, as the package raises it.
/// `file` names the input for check failures.
template <class F>
Failure call_job(const char* tool, const std::string& file, F&& job) {
    try {
        job();
    } catch (const BadInput& e) {
        const std::string w = one_line(e.what());
        return {"BadInput", e.file.empty() ? fmt::format("{}: error: {}", tool, w) : fmt::format("{}: error: {}: {}", tool, e.file, w),
                e.file, w};
    } catch (const CheckFailed& e) {
        std::string w = one_line(e.what());
        if (!file.empty() && w.rfind(file + ": ", 0) == 0) w = w.substr(file.size() + 2);  // name the file once
        return {"CheckFailed", fmt::format("{}: check failed: {}: {}", tool, file, w), file, w};
    } catch (const std::bad_alloc&) {
        return {"BadInput", fmt::format("{}: error: {}: out of memory", tool, file), file, "out of memory"};
    } catch (const py::error_already_set&) {
        throw;   // raised by a Python callback (alloc): its own exception
    } catch (const std::exception& e) {
        const std::string w = one_line(e.what());
        return {"BadInput", fmt::format("{}: error: {}", tool, w), "", w};
    }
    return {};
}

/// Raise `fail` as the package's exception (with the GIL held); nothing when none.
void raise_failure(const Failure& fail) {
    if (!fail.cls) return;
    py::object cls = py::module_::import("ckptkit._errors").attr(fail.cls);
    py::object exc = cls(fail.message, fail.file, fail.reason);
    PyErr_SetObject(cls.ptr(), exc.ptr());
    throw py::error_already_set();
}

/// Run `job` without the GIL under job_mutex; a library error is raised as the package's
/// exception (after the GIL is back). Returns the lines the library logged during the job
/// (taken under the lock: a concurrent job's lines are its own).
template <class F>
std::vector<std::string> run_job(const char* tool, const std::string& file, unsigned threads, F&& job) {
    Failure fail;
    std::vector<std::string> lines;
    {
        py::gil_scoped_release nogil;
        std::lock_guard<std::mutex> lock(job_mutex());
        codec::set_cpu_threads(threads);   // 0: every core the process may use
        fail = call_job(tool, file, job);
        codec::set_cpu_threads(0);
        lines = sink()->take();
    }
    raise_failure(fail);
    return lines;
}

/// Strings in one message and back: a count, then each as its length and bytes.
std::string pack(const std::vector<std::string>& v) {
    std::string m;
    auto put = [&](uint64_t x) { m.append(reinterpret_cast<const char*>(&x), 8); };
    put(v.size());
    for (const auto& s : v) put(s.size()), m += s;
    return m;
}
std::vector<std::string> unpack(const std::string& m) {
    std::size_t at = 0;
    auto get = [&]() {
        uint64_t x = 0;
        if (m.size() - at < 8) throw std::runtime_error("isolated job: short message");
        std::memcpy(&x, m.data() + at, 8);
        at += 8;
        return x;
    };
    std::vector<std::string> v(get());
    for (auto& s : v) {
        const uint64_t n = get();
        if (m.size() - at < n) throw std::runtime_error("isolated job: short message");
        s.assign(m, at, n);
        at += n;
    }
    return v;
}

/// run_job for the jobs that read containers, in a child process (common/isolate.h): a
/// container that crashes libhdf5 ends the child, and this raises BadInput with the tools'
/// line ("fatal signal SIGSEGV while processing it ..."), the child's temporaries removed.
/// `job` fills `outs` (what the caller needs back: json, table, ...), which arrive here.
/// In-process instead when `in_process` (the CUDA decode backend: a forked child cannot
/// use the parent's device) or when no child can be made.
template <class F>
std::vector<std::string> run_job_isolated(const char* tool, const std::string& file, unsigned threads, bool in_process,
                                          std::vector<std::string>& outs, F&& job) {
    Failure fail;
    std::vector<std::string> lines;
    {
        py::gil_scoped_release nogil;
        std::lock_guard<std::mutex> lock(job_mutex());   // held across fork: no other thread is in the library
        std::optional<Isolated> child;
        if (!in_process) {
            try {
                child = run_isolated([&] {
                    codec::set_cpu_threads(threads);
                    const Failure f = call_job(tool, file, job);
                    std::vector<std::string> m = {f.cls ? f.cls : "", f.message, f.file, f.reason};
                    std::vector<std::string> logged = sink()->take();
                    m.push_back(std::to_string(logged.size()));
                    m.insert(m.end(), logged.begin(), logged.end());
                    m.insert(m.end(), outs.begin(), outs.end());
                    return pack(m);
                });
            } catch (const std::system_error&) {
                child.reset();   // no child (out of processes or memory): run here
            }
        }
        if (!child) {
            codec::set_cpu_threads(threads);
            fail = call_job(tool, file, job);
            codec::set_cpu_threads(0);
            lines = sink()->take();
        } else if (!child->ran) {
            const std::string why = !child->signal.empty() ? fatal_signal_reason(child->signal)
                : fmt::format("the isolated reader ended with exit status {} while processing it; no output was written",
                              WIFEXITED(child->status) ? WEXITSTATUS(child->status) : -1);
            fail = {"BadInput", fmt::format("{}: error: {}: {}", tool, file, why), file, why};
        } else {
            std::vector<std::string> m = unpack(child->message);
            static const char* const kinds[] = {"BadInput", "CheckFailed"};
            for (const char* k : kinds)
                if (m[0] == k) fail = {k, m[1], m[2], m[3]};
            const std::size_t n = std::stoul(m[4]);
            lines.assign(m.begin() + 5, m.begin() + 5 + std::ptrdiff_t(n));
            outs.assign(m.begin() + 5 + std::ptrdiff_t(n), m.end());
        }
    }
    raise_failure(fail);
    return lines;
}

/// Whether a container read with --device `name` runs in this process: with the CUDA
/// backend (a forked child cannot use the parent's device), or when CKPTKIT_ISOLATE=0 (saves
/// the fork, docs/python.md; a libhdf5 crash then ends the interpreter). An unknown name is left to the job to refuse.
bool decode_in_process(const std::string& name) {
    if (const char* e = std::getenv("CKPTKIT_ISOLATE"); e && std::string(e) == "0") return true;
    try {
        return codec::resolve_device(name) != codec::Device::Cpu;
    } catch (const std::exception&) {
        return false;
    }
}

/// The options dict the Python side checked: typed getters with defaults.
struct Opts {
    py::dict d;
    bool has(const char* k) const { return d.contains(k) && !d[k].is_none(); }
    template <class T> T get(const char* k, T def) const { return has(k) ? d[k].cast<T>() : def; }
    template <class T> std::optional<T> opt(const char* k) const {
        return has(k) ? std::optional<T>(d[k].cast<T>()) : std::nullopt;
    }
};

CompressOptions compress_options(const Opts& o) {
    CompressOptions c;
    c.tolerance = o.get<double>("tolerance", c.tolerance);
    c.grad_bound = o.get<double>("grad_bound", c.grad_bound);
    c.codec = codec::kind_from_name(o.get<std::string>("codec", "vlog"));
    c.optimizer = o.get<std::string>("optimizer", c.optimizer);
    c.param_bound = o.opt<double>("param_bound");
    c.horizon = o.get<int>("horizon", 0);
    c.hyper.lr = o.opt<double>("lr");
    c.hyper.beta1 = o.opt<double>("beta1");
    c.hyper.beta2 = o.opt<double>("beta2");
    c.hyper.eps = o.opt<double>("eps");
    c.hyper.weight_decay = o.opt<double>("weight_decay");
    c.hyper.amsgrad = o.opt<bool>("amsgrad");
    c.hyper.maximize = o.opt<bool>("maximize");
    c.chunk = o.get<std::size_t>("chunk", 0);
    c.limits.strict = o.get<bool>("strict", false);
    c.device = o.get<std::string>("device", "auto");
    return c;
}

folder::FolderOptions folder_options(const Opts& o) {
    folder::FolderOptions f;
    f.force = o.get<bool>("force", false);
    f.dcp_unit_bytes = o.get<uint64_t>("dcp_unit_mib", 256) << 20;
    return f;
}

/// (json, table, warnings) of a finished job.
py::tuple result(const std::string& json, const std::string& table, const std::vector<std::string>& lines) {
    return py::make_tuple(json, table, lines);
}

void set_decode_device(const std::string& name, const std::string& file) {
    try {
        codec::set_decode_device(codec::resolve_device(name));
    } catch (const std::exception& e) {
        throw BadInput(file, e.what());
    }
}

/// Buffers and borrowed (address, size) ranges making up one in-memory checkpoint.
struct Spans {
    std::vector<py::buffer_info> held;   ///< released with the GIL held (destroyed by the caller)
    std::vector<io::InputFile::Span> spans;
};

Spans make_spans(const py::list& parts) {
    Spans s;
    for (py::handle h : parts) {
        if (py::isinstance<py::tuple>(h)) {   // (address, size): memory the caller keeps alive
            auto t = h.cast<py::tuple>();
            s.spans.push_back({reinterpret_cast<const void*>(t[0].cast<uintptr_t>()), t[1].cast<uint64_t>()});
        } else {
            s.held.push_back(py::reinterpret_borrow<py::buffer>(h).request());
            const auto& b = s.held.back();
            s.spans.push_back({b.ptr, uint64_t(b.size) * uint64_t(b.itemsize)});
        }
    }
    return s;
}

/// A restored checkpoint's memory: the memfd the job filled (restore_bytes), mapped shared
/// and writable. Python sees it through the buffer protocol; tensors made with
/// torch.frombuffer keep it alive; munmap-ed with the last.
struct MemBuffer {
    void* p = nullptr;
    std::size_t n = 0;
    MemBuffer(int fd, std::size_t size) : n(size) {
        void* q = ::mmap(nullptr, std::max<std::size_t>(n, 1), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (q == MAP_FAILED) throw std::bad_alloc();
        p = q;
    }
    ~MemBuffer() { ::munmap(p, std::max<std::size_t>(n, 1)); }
    MemBuffer(const MemBuffer&) = delete;
    MemBuffer& operator=(const MemBuffer&) = delete;
};

}  // namespace

PYBIND11_MODULE(_ckptkit, m) {
    m.doc() = "ckptkit's C++ library (lib/ckpt): compress, verify, restore; use the ckptkit package";
    m.attr("__version__") = CKPTKIT_VERSION;
    container::enable_direct_chunk_writes();   // before any other HDF5 call of ours (container/h5.h)
    sink() = std::make_shared<CollectSink>();
    sink()->set_pattern("%l: %v");
    spdlog::set_default_logger(std::make_shared<spdlog::logger>("ckptkit", sink()));

    py::class_<MemBuffer>(m, "Buffer", py::buffer_protocol(), "writable memory holding a restored checkpoint")
        .def_buffer([](MemBuffer& b) {
            return py::buffer_info(b.p, 1, py::format_descriptor<uint8_t>::format(), 1, {py::ssize_t(b.n)}, {py::ssize_t(1)},
                                   false);
        })
        .def("__len__", [](const MemBuffer& b) { return b.n; });

    m.def("replay_plan", [](py::bytes trace, const std::string& name, std::vector<uint64_t> budgets,
                            std::vector<uint64_t> activation_budgets, const std::string& planner) {
        const std::string text = trace;
        std::string plan;
        run_job("replay-plan", name, 1, [&] {
            replay::PlanRequest req;
            req.budgets = std::move(budgets);
            req.activation_budgets = std::move(activation_budgets);
            req.planner = planner;
            plan = replay::run_plan(text, name, req).plan_json().dump();
        });
        return plan;
    }, py::arg("trace"), py::arg("name"), py::arg("budgets"), py::arg("activation_budgets"), py::arg("planner"),
       "replay-plan TRACE --budget ... --activation-budget ... --planner P -o PLAN: the plan JSON "
       "(formats/plan.md) as text; infeasible budgets are entries with feasible false");

    m.def("compress", [](const std::string& src, const std::string& dst, py::dict d) {
        const Opts o{d};
        std::string json, table;
        const auto lines = run_job("ckpt-compress", src, o.get<unsigned>("threads", 0), [&] {
            const CompressOptions c = compress_options(o);
            if (folder::is_folder(src)) {
                const auto r = folder::compress_folder(src, dst, c, folder_options(o));
                json = r.json(), table = r.table();
                return;
            }
            check_outputs({src}, {dst}, o.get<bool>("force", false));
            const Report r = compress(src, dst, c);
            json = r.json(), table = r.table();
        });
        return result(json, table, lines);
    }, py::arg("src"), py::arg("dst"), py::arg("opts"),
       "ckpt-compress SRC -o DST (a file or a folder); returns (json, table, warnings)");

    m.def("compress_memory", [](const std::string& name, py::list parts, const std::string& dst, py::dict d,
                                const char* tool) {
        const Opts o{d};
        std::string json, table;
        Spans s = make_spans(parts);
        const auto lines = run_job(tool, name, o.get<unsigned>("threads", 0), [&] {
            const CompressOptions c = compress_options(o);
            check_outputs({}, {dst}, true);   // a folder, or not a regular file: refused
            const io::InputFile in(name, s.spans);
            const Report r = compress(in, dst, c);
            json = r.json(), table = r.table();
        });
        return result(json, table, lines);
    }, py::arg("name"), py::arg("parts"), py::arg("dst"), py::arg("opts"), py::arg("tool") = "ckptkit.save",
       "compress the checkpoint made of `parts` (bytes-like objects and (address, size) tuples, "
       "concatenated) into the container DST (replaced atomically); returns (json, table, warnings)");

    m.def("verify", [](const std::string& path, std::optional<std::string> original, py::dict d) {
        const Opts o{d};
        std::vector<std::string> outs;   // json, table, ok ("1" / "0"), first failure
        const auto lines = run_job_isolated("ckpt-verify", path, o.get<unsigned>("threads", 0), decode_in_process("auto"), outs, [&] {
            VerifyOptions v;
            v.grid = o.get<int>("grid", v.grid);
            v.strict = o.get<bool>("strict", false);
            if (folder::is_folder(path)) {
                const auto r = folder::verify_folder(path, original, v);
                outs = {r.json(), r.table(), r.ok ? "1" : "0", r.failures.empty() ? "" : r.failures.front()};
                return;
            }
            if (readable_non_hdf5(path))
                throw BadInput(path, "not a ckptkit container; pass the container (.ckz.h5), and the checkpoint with --original");
            v.original = original;
            const Report r = verify(path, v);
            outs = {r.json(), r.table(), r.ok ? "1" : "0", r.failures.empty() ? "" : r.failures.front()};
        });
        return py::make_tuple(outs.at(0), outs.at(1), lines, outs.at(2) == "1", outs.at(3));
    }, py::arg("path"), py::arg("original"), py::arg("opts"),
       "ckpt-verify PATH [--original ORIGINAL] (in a child process); returns (json, table, warnings, ok, first failure)");

    m.def("restore", [](const std::string& src, const std::string& dst, py::dict d) {
        const Opts o{d};
        const std::string device = o.get<std::string>("device", "auto");
        std::vector<std::string> outs;   // json, table
        const auto lines = run_job_isolated("ckpt-restore", src, o.get<unsigned>("threads", 0), decode_in_process(device), outs, [&] {
            set_decode_device(device, src);
            RestoreOptions r;
            if (folder::is_folder(src)) {
                const auto f = folder::restore_folder(src, dst, r, folder_options(o));
                outs = {f.json(), f.table()};
                return;
            }
            check_outputs({src}, {dst}, o.get<bool>("force", false));
            if (readable_non_hdf5(src)) throw BadInput(src, "not a ckptkit container; pass the container (.ckz.h5) that ckpt-compress wrote");
            const Report rep = restore(src, dst, r);
            outs = {rep.json(), rep.table()};
        });
        return result(outs.at(0), outs.at(1), lines);
    }, py::arg("src"), py::arg("dst"), py::arg("opts"),
       "ckpt-restore SRC -o DST (in a child process); returns (json, table, warnings)");

    m.def("restore_bytes", [](const std::string& src, py::dict d, const char* tool) {
        const Opts o{d};
        const std::string device = o.get<std::string>("device", "auto");
        // the restored file: memory the job fills (a memfd shared with the child), mapped here
        // as a Buffer (writable: tensors may share it)
        const int fd = ::memfd_create("ckptkit.load", MFD_CLOEXEC);
        if (fd < 0) throw std::bad_alloc();
        struct Fd {
            int fd;
            ~Fd() { ::close(fd); }
        } hold{fd};
        std::vector<std::string> outs;   // json, table, restored bytes
        const auto lines = run_job_isolated(tool, src, o.get<unsigned>("threads", 0), decode_in_process(device), outs, [&] {
            set_decode_device(device, src);
            if (readable_non_hdf5(src)) throw BadInput(src, "not a ckptkit container");
            struct Mapping {   // the job's view of the memfd (unmapped when the job ends)
                void* p = nullptr;
                std::size_t n = 0;
                ~Mapping() { if (p) ::munmap(p, std::max<std::size_t>(n, 1)); }
            } view;
            const Report rep = restore_to_memory(src, [&](uint64_t n) -> void* {
                if (::ftruncate(fd, off_t(n)) != 0) throw std::bad_alloc();
                void* p = ::mmap(nullptr, std::max<std::size_t>(n, 1), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
                if (p == MAP_FAILED) throw std::bad_alloc();
                view.p = p;
                view.n = std::size_t(n);
                return p;
            }, RestoreOptions{});
            outs = {rep.json(), rep.table(), std::to_string(view.n)};
        });
        py::object out = py::cast(new MemBuffer(fd, std::size_t(std::stoull(outs.at(2)))), py::return_value_policy::take_ownership);
        return py::make_tuple(out, outs.at(0), outs.at(1), lines);
    }, py::arg("src"), py::arg("opts"), py::arg("tool") = "ckptkit.load",
       "the checkpoint restored from the container SRC, in memory (no file; decoded in a child process); "
       "returns (Buffer, json, table, warnings)");

    m.def("check_checkpoint", [](py::object what, bool strict, const char* tool) {
        // what: a path (str) or a list of parts (compress_memory's) named "<memory>"
        std::string fmt_name;
        const bool is_path = py::isinstance<py::str>(what);
        const std::string name = is_path ? what.cast<std::string>() : std::string("<memory>");
        Spans s;
        if (!is_path) s = make_spans(what.cast<py::list>());
        run_job(tool, name, 1, [&] {
            Limits l;
            l.strict = strict;
            const Checkpoint ck = is_path ? read_checkpoint(name, l) : read_checkpoint(io::InputFile(name, s.spans), l);
            fmt_name = format_name(ck.format);
        });
        return fmt_name;
    }, py::arg("what"), py::arg("strict") = false, py::arg("tool") = "ckptkit.load",
       "parse a checkpoint (path or parts) as the tools do, refusing globals that run code "
       "(strict: only torch.load(weights_only=True)'s); returns its format name");

    m.def("is_container", [](const std::string& path) { return !readable_non_hdf5(path); }, py::arg("path"),
          "false when PATH is a readable file without the HDF5 signature (certainly not a container)");

    m.def("same_bytes", [](uintptr_t address, py::buffer b) {
        const py::buffer_info info = b.request();
        const std::size_t n = std::size_t(info.size) * std::size_t(info.itemsize);
        bool same;
        {
            py::gil_scoped_release nogil;
            same = n == 0 || reinterpret_cast<const void*>(address) == info.ptr ||   // a view of that memory
                   std::memcmp(reinterpret_cast<const void*>(address), info.ptr, n) == 0;
        }
        return same;
    }, py::arg("address"), py::arg("data"), "whether the memory at ADDRESS holds DATA's bytes");
}
