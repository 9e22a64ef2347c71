// Stand-alone driver for the libFuzzer targets in builds without libFuzzer (the default GCC
// build, the sanitizer build): runs LLVMFuzzerTestOneInput once on every file named on the
// command line or found (recursively) in a named folder, in sorted order, after
// LLVMFuzzerInitialize when the target has one. A crash, a
// sanitizer report or an escaping exception other than the target's expected rejections
// fails the process, which is how CTest's fuzz_regress_<target> replays
// test/corpus/fuzz/<target>/ and the seed inputs.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);
extern "C" __attribute__((weak)) int LLVMFuzzerInitialize(int* argc, char*** argv);

namespace {

/// Every regular file under each argument (a file or a folder), sorted; exits 2 on a bad path.
std::vector<std::filesystem::path> inputs(int argc, char** argv) {
    namespace fs = std::filesystem;
    std::vector<fs::path> files;
    for (int i = 1; i < argc; ++i) {
        const fs::path p(argv[i]);
        std::error_code ec;
        if (fs::is_regular_file(p, ec)) {
            files.push_back(p);
        } else if (fs::is_directory(p, ec)) {
            for (const auto& e : fs::recursive_directory_iterator(p))
                if (e.is_regular_file()) files.push_back(e.path());
        } else {
            std::fprintf(stderr, "fuzz replay: error: %s: no such file or folder\n", argv[i]);
            std::exit(2);
        }
    }
    std::sort(files.begin(), files.end());
    return files;
}

}  // namespace

int main(int argc, char** argv) {
    if (LLVMFuzzerInitialize) LLVMFuzzerInitialize(&argc, &argv);  // as libFuzzer does
    const auto files = inputs(argc, argv);
    for (const auto& f : files) {
        std::printf("%s\n", f.c_str());
        std::fflush(stdout);  // the last line names the input if the target crashes
        std::ifstream in(f, std::ios::binary);
        const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
        if (!in.good() && !in.eof()) {
            std::fprintf(stderr, "fuzz replay: error: %s: read error\n", f.c_str());
            return 2;
        }
        LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
    }
    std::printf("fuzz replay: %zu inputs, no finding\n", files.size());
    return files.empty() ? 1 : 0;
}
