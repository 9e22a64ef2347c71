// lib/folder's per-piece hashes (files.h hash_file / hash_units, folder.h check_stored_units):
// what ckptkit.dcp's reader checks of a file it reads in place.
#include <doctest/doctest.h>

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "common/error.h"
#include "common/xxh3.h"
#include "folder/files.h"
#include "folder/folder.h"

using namespace ckpt;
using namespace ckpt::folder;

namespace {

/// A scratch folder with one file `f` of n bytes (byte i = i * 7 mod 251), removed at the end.
struct Scratch {
    std::filesystem::path dir;
    std::string f;
    std::string bytes;
    explicit Scratch(std::size_t n) {
        dir = std::filesystem::temp_directory_path() / ("ckptkit-test-files-" + std::to_string(::getpid()));
        std::filesystem::create_directories(dir);
        f = (dir / "f.distcp").string();
        for (std::size_t i = 0; i < n; ++i) bytes.push_back(char(i * 7 % 251));
        std::ofstream(f, std::ios::binary).write(bytes.data(), std::streamsize(n));
    }
    ~Scratch() { std::filesystem::remove_all(dir); }
    uint64_t xxh3(std::size_t at, std::size_t n) const { return XXH3_64bits(bytes.data() + at, n); }
};

}  // namespace

TEST_CASE("hash_file's units: XXH3-64 of each unit-byte piece, the last one shorter; hash_units the same") {
    const std::size_t unit = 3 << 20, n = 7 * (1 << 20) + 5;   // pieces across the 1 MiB reads: 3, 3, 1 MiB + 5
    const Scratch s(n);
    const Digest d = hash_file(s.f, unit);
    CHECK(d.size == n);
    CHECK(d.xxh3 == s.xxh3(0, n));
    REQUIRE(d.units.size() == 3);
    CHECK(d.units[0] == s.xxh3(0, unit));
    CHECK(d.units[1] == s.xxh3(unit, unit));
    CHECK(d.units[2] == s.xxh3(2 * unit, n - 2 * unit));
    CHECK(hash_file(s.f).units.empty());
    CHECK(hash_units(s.f, unit, 1, 2) == std::vector<uint64_t>{d.units[1], d.units[2]});
    CHECK_THROWS_AS(hash_units(s.f, unit, 2, 2), BadInput);   // piece 3 begins past the end
    const Digest whole = hash_file(s.f, n);                     // one unit: the file's own hash
    CHECK(whole.units == std::vector<uint64_t>{d.xxh3});
}

TEST_CASE("check_stored_units: the pieces read checked against the manifest's hashes, naming the bytes that differ") {
    const std::size_t unit = 1 << 20, n = 2 * unit + 100;
    const Scratch s(n);
    const std::string dir = s.dir.string();
    const Digest d = hash_file(s.f, unit);
    std::vector<std::string> hex;
    for (uint64_t h : d.units) hex.push_back(hex64(h));
    check_stored_units(dir, "f.distcp", n, unit, hex, 0, 3);
    check_stored_units(dir, "f.distcp", n, unit, hex, 2, 1);
    // a flipped byte in piece 1: piece 2 still checks, piece 1 fails naming its bytes
    std::string flipped = s.bytes;
    flipped[unit + 17] ^= 1;
    std::ofstream(s.f, std::ios::binary | std::ios::trunc).write(flipped.data(), std::streamsize(n));
    check_stored_units(dir, "f.distcp", n, unit, hex, 2, 1);
    try {
        check_stored_units(dir, "f.distcp", n, unit, hex, 1, 2);
        FAIL("no error");
    } catch (const CheckFailed& e) {
        CHECK(std::string(e.what()) == s.f + ": xxh3 of bytes 1048576..2097152 " + hex64(XXH3_64bits(flipped.data() + unit, unit)) +
                                           " differs from the manifest's " + hex[1]);
    }
    // another size than the manifest's: refused before any piece is read
    try {
        check_stored_units(dir, "f.distcp", n + 1, unit, hex, 2, 1);
        FAIL("no error");
    } catch (const CheckFailed& e) {
        CHECK(std::string(e.what()) == s.f + ": size " + std::to_string(n) + " differs from the manifest's " + std::to_string(n + 1));
    }
    CHECK_THROWS_AS(check_stored_units(dir, "f.distcp", n, unit, {"not hex", hex[1], hex[2]}, 0, 1), BadInput);
    // a list that does not cover the file (one hash short, or a piece past it): the manifest is refused
    CHECK_THROWS_WITH_AS(check_stored_units(dir, "f.distcp", n, unit, {hex[0], hex[1]}, 1, 1),
                         doctest::Contains("manifest xxh3_units of f.distcp do not cover its size"), BadInput);
    CHECK_THROWS_AS(check_stored_units(dir, "f.distcp", n, unit, hex, 2, 2), BadInput);
    CHECK_THROWS_AS(check_stored_units(dir, "f.distcp", n, 0, hex, 0, 1), BadInput);
    try {
        check_stored_units(dir, "gone.distcp", n, unit, hex, 0, 1);
        FAIL("no error");
    } catch (const BadInput& e) {
        CHECK(std::string(e.what()).find("missing (listed in the manifest)") != std::string::npos);
    }
}
