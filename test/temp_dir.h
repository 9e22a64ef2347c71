// A fresh directory under the system temp dir for one test, removed with its contents.
#pragma once
#include <doctest/doctest.h>

#include <stdlib.h>

#include <filesystem>
#include <string>

namespace ckpt::test {

struct TempDir {
    std::filesystem::path path;   ///< the directory (exists while the object lives)
    TempDir() {
        std::string t = (std::filesystem::temp_directory_path() / "ckptkit-test-XXXXXX").string();
        REQUIRE(mkdtemp(t.data()) != nullptr);
        path = t;
    }
    ~TempDir() { std::filesystem::remove_all(path); }
    TempDir(const TempDir&) = delete;
    TempDir& operator=(const TempDir&) = delete;
};

}  // namespace ckpt::test
