// ckptkit._ckptkit: the Python package's bindings over the library the tools call
// (lib/ckpt/pipeline.h, lib/folder/folder.h, lib/replay/job.h); the package's Python side (ckptkit/__init__.py)
// checks the options and shapes the results. Every call releases the GIL around the C++
// work and holds one process-wide lock meanwhile (libhdf5 is not thread-safe: one job at a
// time). Library errors become the package's exceptions with the CLI's one-line message:
// BadInput -> ckptkit.BadInput ("TOOL: error: FILE: what"), CheckFailed ->
// ckptkit.CheckFailed ("TOOL: check failed: FILE: what"). Warnings the library logs
// (spdlog) are collected per call and handed back with the report. Container reads (verify,
// restore, restore_bytes) run in the helper process ckptkit-reader (reader.h), so that a
// container that crashes libhdf5 raises instead of ending the interpreter.
#include <nlohmann/json.hpp>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <spdlog/sinks/base_sink.h>
#include <spdlog/spdlog.h>

#include <dlfcn.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <future>
#include <memory>
#include <mutex>
#include <new>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "folder/dcp.h"
#include "folder/folder.h"
#include "ckpt/optimizer.h"
#include "ckpt/pipeline.h"
#include "codec/codec.h"
#include "common/cancel.h"
#include "common/error.h"
#include "common/file.h"
#include "common/cleanup.h"
#include "common/isolate.h"
#include "reader.h"
#include "container/h5.h"
#include "codec/backend.h"
#include "io/checkpoint.h"
#include "replay/plan_io.h"
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

std::shared_ptr<pkg::CollectSink>& sink() {
    static std::shared_ptr<pkg::CollectSink> s;
    return s;
}

/// Raise `fail` as the package's exception (with the GIL held); nothing when none.
void raise_failure(const pkg::Failure& fail) {
    if (fail.cls.empty()) return;
    py::object cls = py::module_::import("ckptkit._errors").attr(fail.cls.c_str());
    py::object exc = cls(fail.message, fail.file, fail.reason);
    PyErr_SetObject(cls.ptr(), exc.ptr());
    throw py::error_already_set();
}

/// Run `job` on this thread (the caller released the GIL and holds job_mutex) with
/// `threads` codec threads (0: every core the process may use): what it raised, and into
/// *lines what it logged.
template <class F>
pkg::Failure run_here(const char* tool, const std::string& file, unsigned threads, F&& job, std::vector<std::string>& lines) {
    codec::set_cpu_threads(threads);
    pkg::Failure fail = pkg::call_job(tool, file, job);
    codec::set_cpu_threads(0);
    lines = sink()->take();
    return fail;
}

/// Run `job` without the GIL under job_mutex; a library error is raised as the package's
/// exception (after the GIL is back). `file` names the input for check failures. Returns
/// the lines the library logged during the job (taken under the lock: a concurrent job's
/// lines are its own). The job runs on a thread of its own while the caller looks at the
/// interpreter's signals every 50 ms (PyErr_CheckSignals: the main thread only): Ctrl-C
/// cancels the job at its next chunk (common/cancel.h: its temporary removed, an existing
/// output kept) and raises the KeyboardInterrupt here once the job has unwound.
template <class F>
std::vector<std::string> run_job(const char* tool, const std::string& file, unsigned threads, F&& job) {
    pkg::Failure fail;
    std::vector<std::string> lines;
    std::optional<py::error_already_set> interrupt;
    {
        py::gil_scoped_release nogil;
        std::lock_guard<std::mutex> lock(job_mutex());
        std::atomic<bool> cancel{false};
        std::promise<void> finished;
        std::future<void> done = finished.get_future();
        std::thread worker([&] {
            CancelScope scope(cancel);
            fail = run_here(tool, file, threads, job, lines);
            finished.set_value();
        });
        while (done.wait_for(std::chrono::milliseconds(50)) != std::future_status::ready) {
            if (interrupt) continue;
            py::gil_scoped_acquire gil;
            if (PyErr_CheckSignals() != 0) {
                interrupt.emplace();  // the pending exception (KeyboardInterrupt), raised below
                cancel.store(true);
            }
        }
        worker.join();
    }
    if (interrupt) throw std::move(*interrupt);
    raise_failure(fail);
    return lines;
}

/// The helper next to this module (python/CMakeLists.txt puts both in ckptkit/).
std::string reader_path() {
    Dl_info info{};
    if (::dladdr(reinterpret_cast<void*>(&raise_failure), &info) == 0 || !info.dli_fname) return "";
    std::string p = info.dli_fname;
    const auto slash = p.rfind('/');
    return (slash == std::string::npos ? std::string(".") : p.substr(0, slash)) + "/ckptkit-reader";
}

/// Whether a container read runs in this process: decoding on the GPU (a helper cannot use
/// this process's device: --device cuda, or auto with one), or CKPTKIT_ISOLATE=0 (saves
/// the helper's start, docs/python.md; a libhdf5 crash then ends the interpreter).
bool read_in_process(const std::string& device) {
    if (const char* e = std::getenv("CKPTKIT_ISOLATE"); e && std::string(e) == "0") return true;
    try {
        return codec::resolve_device(device) != codec::Device::Cpu;
    } catch (const std::exception&) {
        return false;   // an unknown name: the job refuses it
    }
}

/// A container read (pkg::run_read_job's request `req`), in the helper process
/// ckptkit-reader (common/isolate.h) unless read_in_process: a container that crashes
/// libhdf5 ends the helper, and this raises BadInput with the tools' line ("fatal signal
/// SIGFPE while processing it ..."), the helper's temporaries removed; a helper ended by
/// SIGINT / SIGTERM raises the interpreter's pending KeyboardInterrupt, else BadInput
/// "interrupted". In this process too when the helper cannot be started. Returns the job's outputs; *lines: what it logged.
std::vector<std::string> run_read(const nlohmann::json& req, int memfd, std::vector<std::string>& lines) {
    const std::string tool = req.at("tool").get<std::string>(), file = req.at("src").get<std::string>();
    const std::string device = pkg::Opts{req.at("opts")}.get<std::string>("device", "auto");
    pkg::Failure fail;
    std::vector<std::string> outs;
    bool interrupted = false;
    {
        py::gil_scoped_release nogil;
        std::lock_guard<std::mutex> lock(job_mutex());
        std::optional<Isolated> helper;
        if (!read_in_process(device)) {
            try {
                std::vector<int> pass;
                if (memfd >= 0) pass.push_back(memfd);
                helper = run_isolated(reader_path(), {req.dump()}, pass);
            } catch (const std::system_error&) {
                helper.reset();   // no helper (not built next to the module, out of processes): here
            }
        }
        if (!helper) {
            fail = run_here(tool.c_str(), file, req.value("threads", 0u), [&] { outs = pkg::run_read_job(req, memfd); }, lines);
        } else if (!helper->ran) {
            interrupted = helper->signal == "SIGINT" || helper->signal == "SIGTERM" || helper->signal == "SIGHUP";
            const std::string why =
                interrupted ? "interrupted by " + helper->signal + "; no output was written"
                : !helper->signal.empty() ? fatal_signal_reason(helper->signal)
                : fmt::format("the reader process ended with exit status {} while processing it; no output was written",
                              WIFEXITED(helper->status) ? WEXITSTATUS(helper->status) : -1);
            fail = pkg::bad_input(tool, file, why);
        } else {
            try {
                pkg::unpack_result(helper->message, fail, lines, outs);
            } catch (const std::exception& e) {
                fail = pkg::bad_input(tool, file, e.what());
            }
        }
    }
    // Ctrl-C reached the helper and this interpreter alike: KeyboardInterrupt, as Python raises it
    if (interrupted && PyErr_CheckSignals() != 0) throw py::error_already_set();
    raise_failure(fail);
    return outs;
}

/// A checked options dict as JSON (None, bool, int, float and str values), for pkg::Opts.
nlohmann::json to_json(const py::dict& d) {
    nlohmann::json j = nlohmann::json::object();
    for (auto item : d) {
        const std::string k = py::str(item.first);
        py::handle v = item.second;
        if (v.is_none()) j[k] = nullptr;
        else if (py::isinstance<py::bool_>(v)) j[k] = v.cast<bool>();
        else if (py::isinstance<py::int_>(v)) j[k] = v.cast<int64_t>();
        else if (py::isinstance<py::float_>(v)) j[k] = v.cast<double>();
        else j[k] = py::str(v).cast<std::string>();
    }
    return j;
}

/// ckpt-compress's options from the package's.
CompressOptions compress_options(const pkg::Opts& o) {
    CompressOptions c;
    c.tolerance = o.get<double>("tolerance", c.tolerance);
    c.grad_bound = o.get<double>("grad_bound", c.grad_bound);
    c.codec = codec::kind_from_name(o.get<std::string>("codec", "vlog"));
    c.optimizer = o.get<std::string>("optimizer", c.optimizer);
    c.param_bound = o.opt<double>("param_bound");
    c.horizon = o.get<int>("horizon", 0);
    c.bound_param = o.get<std::string>("bound", "update") == "param";
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
    c.allow_no_state = o.get<bool>("allow_no_state", false);   // ckptkit.save: model-only objects stored exactly
    c.python_names = true;                                        // warnings say tolerance=, not --tolerance
    return c;
}

/// (json, table, warnings) of a finished job.
py::tuple result(const std::string& json, const std::string& table, const std::vector<std::string>& lines) {
    return py::make_tuple(json, table, lines);
}

/// Buffers and borrowed (address, size) ranges making up one in-memory checkpoint.
struct Spans {
    std::vector<py::buffer_info> held;   ///< released with the GIL held (destroyed by the caller)
    std::vector<py::object> fills;       ///< the parts' fill callables (likewise)
    std::vector<io::InputFile::Span> spans;
};

/// compress_memory's parts as InputFile spans: a bytes-like object; (address, size), memory
/// the caller keeps alive; or (fill, size), `size` bytes that fill(offset, memoryview) writes
/// into the memoryview (a CUDA storage copied in pieces; called with the GIL taken, from any
/// thread; a Python exception becomes the read's BadInput).
Spans make_spans(const py::list& parts) {
    Spans s;
    for (py::handle h : parts) {
        if (py::isinstance<py::tuple>(h)) {
            auto t = h.cast<py::tuple>();
            if (t.size() == 2 && PyCallable_Check(t[0].ptr())) {
                s.fills.push_back(py::reinterpret_borrow<py::object>(t[0]));
                PyObject* fn = s.fills.back().ptr();
                s.spans.push_back({nullptr, t[1].cast<uint64_t>(), [fn](uint64_t off, void* dst, std::size_t len) {
                    py::gil_scoped_acquire gil;
                    try {
                        const py::handle f{fn};
                        f(off, py::memoryview::from_memory(dst, py::ssize_t(len), false));
                    } catch (py::error_already_set& e) {
                        throw std::runtime_error(e.what());
                    }
                }});
                continue;
            }
            s.spans.push_back({reinterpret_cast<const void*>(t[0].cast<uintptr_t>()), t[1].cast<uint64_t>(), {}});
        } else {
            s.held.push_back(py::reinterpret_borrow<py::buffer>(h).request());
            const auto& b = s.held.back();
            s.spans.push_back({b.ptr, uint64_t(b.size) * uint64_t(b.itemsize), {}});
        }
    }
    return s;
}

/// A restored checkpoint's memory: the memfd the job filled (restore_bytes), mapped shared
/// and writable (MAP_POPULATE: its pages exist; mapping them in one call saves a fault per
/// 4 KiB). Python sees it through the buffer protocol (tensors made with torch.frombuffer
/// keep it alive; munmap-ed with the last) and, as a file, through fileno() (the memfd,
/// owned here, closed with the buffer: torch 2.x's torch.load(mmap=True) maps its pages).
struct MemBuffer {
    void* p = nullptr;
    std::size_t n = 0;
    int fd = -1;
    MemBuffer(int memfd, std::size_t size) : n(size) {
        void* q = ::mmap(nullptr, std::max<std::size_t>(n, 1), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, memfd, 0);
        if (q == MAP_FAILED) throw std::bad_alloc();
        p = q;
        fd = memfd;
    }
    ~MemBuffer() {
        ::munmap(p, std::max<std::size_t>(n, 1));
        ::close(fd);
    }
    MemBuffer(const MemBuffer&) = delete;
    MemBuffer& operator=(const MemBuffer&) = delete;
};

}  // namespace

PYBIND11_MODULE(_ckptkit, m) {
    m.doc() = "ckptkit's C++ library (lib/ckpt): compress, verify, restore; use the ckptkit package";
    m.attr("__version__") = CKPTKIT_VERSION;
    container::enable_direct_chunk_writes();   // before any other HDF5 call of ours (container/h5.h)
    sink() = pkg::collect_logs();

    py::class_<MemBuffer>(m, "Buffer", py::buffer_protocol(), "writable memory holding a restored checkpoint")
        .def_buffer([](MemBuffer& b) {
            return py::buffer_info(b.p, 1, py::format_descriptor<uint8_t>::format(), 1, {py::ssize_t(b.n)}, {py::ssize_t(1)},
                                   false);
        })
        .def("__len__", [](const MemBuffer& b) { return b.n; })
        .def("fileno", [](const MemBuffer& b) { return b.fd; }, "the memfd holding the bytes (valid while the buffer lives)");

    m.def("parse_bytes", [](const std::string& s) { return replay::parse_bytes(s); }, py::arg("size"),
          "a size string (\"44GiB\", \"1.5mib\", \"8 MiB\", \"123\") in bytes, as replay-plan reads it; "
          "ValueError otherwise");

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
        const pkg::Opts o{to_json(d)};
        std::string json, table;
        const auto lines = run_job("ckpt-compress", src, o.get<unsigned>("threads", 0), [&] {
            const CompressOptions c = compress_options(o);
            const folder::FolderOptions fo = pkg::folder_options(o);
            if (folder::is_folder(src)) {
                const auto r = folder::compress_folder(src, dst, c, fo, fo.serial ? serial_comm() : world_comm());
                json = r.json(), table = r.table();
                return;
            }
            check_outputs({src}, {dst}, fo.force);
            const Report r = compress(src, dst, c);
            json = r.json(), table = r.table();
        });
        return result(json, table, lines);
    }, py::arg("src"), py::arg("dst"), py::arg("opts"),
       "ckpt-compress SRC -o DST (a file or a folder); returns (json, table, warnings)");

    m.def("compress_memory", [](const std::string& name, py::list parts, const std::string& dst, py::dict d,
                                const char* tool) {
        const pkg::Opts o{to_json(d)};
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
       "compress the checkpoint made of `parts` (bytes-like objects, (address, size) and "
       "(fill, size) tuples, concatenated) into the container DST (replaced atomically); returns (json, table, warnings)");

    m.def("verify", [](const std::string& path, std::optional<std::string> original, py::dict d) {
        const pkg::Opts o{to_json(d)};
        const nlohmann::json req = {{"job", "verify"}, {"tool", "ckpt-verify"}, {"src", path},
                                    {"original", original ? nlohmann::json(*original) : nlohmann::json(nullptr)},
                                    {"threads", o.get<unsigned>("threads", 0)}, {"opts", o.j}};
        std::vector<std::string> lines;
        const auto outs = run_read(req, -1, lines);   // json, table, ok, first failure
        return py::make_tuple(outs.at(0), outs.at(1), lines, outs.at(2) == "1", outs.at(3));
    }, py::arg("path"), py::arg("original"), py::arg("opts"),
       "ckpt-verify PATH [--original ORIGINAL] (in the reader process); returns (json, table, warnings, ok, first failure)");

    m.def("restore", [](const std::string& src, const std::string& dst, py::dict d) {
        const pkg::Opts o{to_json(d)};
        const nlohmann::json req = {{"job", "restore"}, {"tool", "ckpt-restore"}, {"src", src}, {"dst", dst},
                                    {"threads", o.get<unsigned>("threads", 0)}, {"opts", o.j}};
        std::vector<std::string> lines;
        const auto outs = run_read(req, -1, lines);   // json, table
        return result(outs.at(0), outs.at(1), lines);
    }, py::arg("src"), py::arg("dst"), py::arg("opts"),
       "ckpt-restore SRC -o DST (in the reader process); returns (json, table, warnings)");

    m.def("restore_bytes", [](const std::string& src, py::dict d, const char* tool, std::optional<std::string> file) {
        const pkg::Opts o{to_json(d)};
        nlohmann::json req = {{"job", "restore_bytes"}, {"tool", tool}, {"src", src},
                              {"threads", o.get<unsigned>("threads", 0)}, {"opts", o.j}};
        if (file) req["file"] = *file;
        // the restored file: a memfd the job fills, mapped here as a Buffer (writable:
        // tensors may share it)
        const int fd = ::memfd_create("ckptkit.load", MFD_CLOEXEC);
        if (fd < 0) throw std::bad_alloc();
        struct Fd {
            int fd;
            ~Fd() {
                if (fd >= 0) ::close(fd);
            }
        } hold{fd};
        std::vector<std::string> lines;
        const auto outs = run_read(req, fd, lines);   // json, table, bytes
        auto* mem = new MemBuffer(fd, std::size_t(std::stoull(outs.at(2))));
        hold.fd = -1;   // the buffer owns it now
        py::object out = py::cast(mem, py::return_value_policy::take_ownership);
        return py::make_tuple(out, outs.at(0), outs.at(1), lines);
    }, py::arg("src"), py::arg("opts"), py::arg("tool") = "ckptkit.load", py::arg("file") = std::nullopt,
       "the checkpoint restored from the container SRC (or, with FILE, that original file of the compressed "
       "folder SRC), in memory (no file; decoded in the reader process); returns (Buffer, json, table, warnings)");
    m.def("read_dcp_moments", [](const std::string& dir, py::list reads, unsigned threads) {
        // in this process, not the reader process: a DCP folder is trusted input already
        // (torch unpickles its .metadata), and each container's stored bytes are checked
        // against the manifest's XXH3 before libhdf5 opens it
        std::vector<folder::DcpMomentRead> rs;
        std::vector<uint8_t*> dst;
        for (const auto& r : reads) {
            const auto t = r.cast<py::tuple>();
            rs.push_back({t[0].cast<std::string>(), t[1].cast<std::string>(), t[2].cast<uint64_t>(), t[3].cast<uint64_t>(),
                          t[4].cast<uint64_t>(), t[5].cast<uint64_t>()});
            dst.push_back(reinterpret_cast<uint8_t*>(t[6].cast<uintptr_t>()));
        }
        run_job("ckptkit.dcp", dir, threads, [&] {
            std::vector<uint64_t> at;   // read i's bytes start at output offset at[i]
            uint64_t total = 0;
            for (const auto& r : rs) at.push_back(total), total += r.count * r.element_size;
            auto memory = [&](uint64_t off) {   // read i's bytes: count * element size at its address
                const std::size_t i = std::size_t(std::upper_bound(at.begin(), at.end(), off) - at.begin()) - 1;
                return dst[i] + (off - at[i]);
            };
            folder::read_dcp_moments(dir, rs, [&](uint64_t off, const uint8_t* p, std::size_t n) {
                std::memcpy(memory(off), p, n);
            }, memory);
        });
    }, py::arg("dir"), py::arg("reads"), py::arg("threads") = 0,
       "ckptkit.dcp's reader: READS, (moments entry, gathered tensor, first element, count, numel, element size, "
       "address) each, decoded from the compressed folder DIR (only the parameters they name) into the memory at "
       "each address (count * element size bytes, which the caller keeps alive)");
    m.def("override_out_of_range", [](const std::string& name, double x) { return override_out_of_range(name, x); },
          py::arg("name"), py::arg("x"),
          "why the override NAME = X (lr, beta1, beta2, eps, weight_decay) is outside what torch.optim.Adam accepts, "
          "or '' (ckpt-compress's check of its flags)");
    m.def("check_device", [](const std::string& name) {
        try {
            (void)codec::resolve_device(name);
        } catch (const std::exception& e) {
            throw py::value_error(e.what());
        }
    }, py::arg("name"), "ValueError (the reason) when NAME (cpu, cuda, auto) cannot be used here: cuda without a device");
    m.def("shell_offsets", [](const std::string& cuts, const std::vector<std::pair<uint64_t, uint64_t>>& items) {
        const auto c = folder::cuts_from(nlohmann::json::parse(cuts));
        std::vector<int64_t> out;
        for (const auto& [offset, length] : items) {
            const auto at = folder::shell_offset(c, offset, length);
            out.push_back(at ? int64_t(*at) : -1);
        }
        return out;
    }, py::arg("cuts"), py::arg("items"),
       "where ITEMS, (offset, length) byte ranges of a .distcp file stored as a shell with CUTS (the manifest's "
       "JSON), lie in the shell: each offset less the cut bytes before it, or -1 where it overlaps a cut");
    m.def("check_stored", [](const std::string& dir, const std::string& file) {
        run_job("ckptkit.dcp", dir, 1, [&] { folder::check_stored_file(dir, file); });
    }, py::arg("dir"), py::arg("file"),
       "FILE (its original path) of the compressed folder DIR: its stored file's size and XXH3 as the manifest "
       "lists them, else CheckFailed naming it");
    m.def("check_stored_units", [](const std::string& dir, const std::string& stored, uint64_t size, uint64_t unit,
                                   const std::vector<std::string>& units, uint64_t first, uint64_t count) {
        run_job("ckptkit.dcp", dir, 1, [&] { folder::check_stored_units(dir, stored, size, unit, units, first, count); });
    }, py::arg("dir"), py::arg("stored"), py::arg("size"), py::arg("unit"), py::arg("units"), py::arg("first"),
       py::arg("count"),
       "pieces FIRST..FIRST+COUNT of UNIT bytes of the stored file STORED of the compressed folder DIR against UNITS "
       "(the manifest's xxh3_units, all of them, hex) and its SIZE, else CheckFailed naming it");
    m.def("commit_dcp_save", [](const std::string& dir, const std::vector<std::string>& parts, const std::string& metadata,
                                const std::string& tag) {
        run_job("ckptkit.dcp", dir, 1, [&] { folder::commit_dcp_save(dir, parts, metadata, tag); });
    }, py::arg("dir"), py::arg("parts"), py::arg("metadata"), py::arg("tag"),
       "ckptkit.dcp.FileSystemWriter's commit of the save TAG into DIR: the ranks' compressed folders PARTS moved into "
       "DIR/ckptkit-TAG/, the manifest, then METADATA renamed onto DIR/.metadata, then what earlier saves left removed");

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

    m.def("hdf5_extent", [](const std::string& path) -> py::object {
        try {
            const auto x = container::hdf5_extent(path);
            if (!x) return py::none();
            return py::make_tuple(x->size, x->eof ? py::object(py::int_(x->eof)) : py::none());
        } catch (const std::system_error& e) {
            errno = e.code().value();
            PyErr_SetFromErrnoWithFilename(PyExc_OSError, path.c_str());
            throw py::error_already_set();
        }
    }, py::arg("path"),
       "(size, end its HDF5 superblock states, or None where unknown) of a file with the HDF5 signature, else None "
       "(container/h5.h hdf5_extent); OSError when it cannot be read");
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

    m.def("copy_spans", [](const std::vector<std::array<uint64_t, 3>>& spans, unsigned threads) {
        // pieces of 4 MiB handed out in order to `threads` threads (this one included)
        constexpr uint64_t kPiece = 4 << 20;
        std::vector<std::array<uint64_t, 3>> pieces;
        for (const auto& [dst, src, n] : spans)
            for (uint64_t o = 0; o < n; o += kPiece) pieces.push_back({dst + o, src + o, std::min(kPiece, n - o)});
        py::gil_scoped_release nogil;
        std::atomic<std::size_t> next{0};
        auto run = [&] {
            for (std::size_t i; (i = next.fetch_add(1)) < pieces.size();)
                std::memcpy(reinterpret_cast<void*>(pieces[i][0]), reinterpret_cast<const void*>(pieces[i][1]), pieces[i][2]);
        };
        const std::size_t nt = std::min<std::size_t>(std::max(1u, threads ? threads : codec::cpu_threads()), pieces.size());
        std::vector<std::thread> ts;
        for (std::size_t t = 1; t < nt; ++t) ts.emplace_back(run);
        run();
        for (auto& t : ts) t.join();
    }, py::arg("spans"), py::arg("threads") = 0,
       "copy each (dst address, src address, bytes) span, in 4 MiB pieces on THREADS threads (0: every core)");
}
