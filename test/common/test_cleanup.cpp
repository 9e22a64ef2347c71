// common/cleanup.h: the signal-time removal of temporaries. remove_path_now on a tree larger
// than one getdents64 buffer; in forked children, a noted file and folder removed by SIGTERM
// (the child then dies by it) and by SIGSEGV (exit 2 and the prepared line on stderr).
#include <doctest/doctest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <filesystem>
#include <fstream>
#include <string>

#include "../temp_dir.h"
#include "common/cleanup.h"

namespace fs = std::filesystem;
using ckpt::test::TempDir;

namespace {

void make_tree(const fs::path& root) {
    fs::create_directories(root / "a" / "b" / "c");
    for (int i = 0; i < 300; ++i)  // 300 names: more than one 4 KiB getdents64 buffer
        std::ofstream(root / "a" / ("file-with-a-long-name-" + std::to_string(i))) << i;
    std::ofstream(root / "a" / "b" / "c" / "deep") << "x";
    std::ofstream(root / "top") << "y";
}

/// Fork; the child notes `file` and `folder`, installs the handlers, and raises `sig`.
/// Returns the child's wait status; its stderr goes to `err_path`.
int child_raises(int sig, const std::string& file, const std::string& folder, const std::string& err_path) {
    const pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
        std::freopen(err_path.c_str(), "w", stderr);
        ckpt::temp_note(file, false);
        ckpt::temp_note(folder, true);
        ckpt::temp_note(folder + "/never-made", false);  // a noted path that does not exist
        ckpt::install_signal_cleanup([](const char* name) {
            return ckpt::FatalMessages{std::string("tool: error: in.h5: fatal signal ") + name + "\n", ""};
        });
        std::raise(sig);
        _exit(0);  // not reached: SIGTERM kills, SIGSEGV exits 2
    }
    int status = 0;
    REQUIRE(waitpid(pid, &status, 0) == pid);
    return status;
}

}  // namespace

TEST_CASE("remove_path_now: a folder tree, a file, a missing path") {
    TempDir t;
    make_tree(t.path / "tree");
    CHECK(ckpt::remove_path_now((t.path / "tree").string()));
    CHECK_FALSE(fs::exists(t.path / "tree"));
    std::ofstream(t.path / "f") << "z";
    CHECK(ckpt::remove_path_now((t.path / "f").string()));
    CHECK_FALSE(fs::exists(t.path / "f"));
    CHECK(ckpt::remove_path_now((t.path / "missing").string()));
}

TEST_CASE("signals: SIGTERM removes the noted temporaries, then ends the process by SIGTERM") {
    TempDir t;
    const std::string file = (t.path / ".out.tmp-1-0").string(), folder = (t.path / ".dir.tmp-1").string();
    std::ofstream(file) << "partial";
    make_tree(folder);
    std::ofstream(t.path / "kept") << "not noted";
    const int status = child_raises(SIGTERM, file, folder, (t.path / "err").string());
    CHECK(WIFSIGNALED(status));
    CHECK(WTERMSIG(status) == SIGTERM);
    CHECK_FALSE(fs::exists(file));
    CHECK_FALSE(fs::exists(folder));
    CHECK(fs::exists(t.path / "kept"));
}

#if !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
TEST_CASE("signals: SIGSEGV removes the noted temporaries, prints the prepared line, exits 2") {
    TempDir t;
    const std::string file = (t.path / ".out.tmp-1-0").string(), folder = (t.path / ".dir.tmp-1").string();
    std::ofstream(file) << "partial";
    make_tree(folder);
    const int status = child_raises(SIGSEGV, file, folder, (t.path / "err").string());
    REQUIRE(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 2);
    CHECK_FALSE(fs::exists(file));
    CHECK_FALSE(fs::exists(folder));
    std::ifstream in(t.path / "err");
    const std::string err((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    CHECK(err == "tool: error: in.h5: fatal signal SIGSEGV\n");
}
#endif
