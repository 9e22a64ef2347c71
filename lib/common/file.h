// Crash-safe outputs (temporary name in the same folder, fsync, rename). SPEC §4.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace ckpt {

/// A file written under "<dir>/.<name>.tmp-<pid>-<n>" and renamed onto `path` by commit()
/// after fsync (file and folder). Destroying it without commit() removes the temporary.
class AtomicOutput {
public:
    explicit AtomicOutput(std::string path);
    ~AtomicOutput();
    AtomicOutput(const AtomicOutput&) = delete;
    AtomicOutput& operator=(const AtomicOutput&) = delete;
    const std::string& temp_path() const { return temp_; }
    /// fsync the temporary, rename it onto the final path, fsync the folder.
    /// Throws std::runtime_error (message names the path and errno text).
    void commit();

private:
    std::string path_, temp_;
    bool done_ = false;
};

/// fsync a path (file or folder). Throws std::runtime_error.
void fsync_path(const std::string& path);

/// Sequential writer with positional patching, for restore outputs. Throws
/// std::runtime_error on any write failure (disk full, file-size limit).
class FileWriter {
public:
    explicit FileWriter(const std::string& path);
    ~FileWriter();
    void write(const void* data, uint64_t n);
    void pwrite(uint64_t offset, const void* data, uint64_t n);
    void skip(uint64_t n) { off_ += n; }   ///< leave n bytes to be filled by pwrite
    void close();   ///< fsync and close
    uint64_t offset() const { return off_; }

private:
    std::string path_;
    int fd_ = -1;
    uint64_t off_ = 0;
};

}  // namespace ckpt
