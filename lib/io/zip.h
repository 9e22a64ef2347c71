// Reader for the stored (uncompressed) ZIP/ZIP64 archives written by torch.save (docs/design.md,
// PKWARE APPNOTE 6.3). Only the central directory and local headers are read.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "io/checkpoint.h"
#include "io/file.h"
#include "io/name_index.h"

namespace ckpt::io {

/// One archive member, with absolute file offsets (any bytes before the archive included).
struct ZipEntry {
    std::string name;
    uint64_t header_offset = 0;   ///< local file header, absolute
    uint64_t data_offset = 0;     ///< first data byte: header + 30 + name len + local extra len
    uint64_t size = 0;            ///< bytes (stored: compressed == uncompressed)
    uint32_t crc32 = 0;           ///< CRC-32 from the central directory
    uint16_t flags = 0;           ///< general purpose bit flags
    /// Absolute offsets of every u32 CRC-32 field describing this entry: the local header
    /// (+14, only when flag bit 3 is clear), the data descriptor (when bit 3 is set, after
    /// the optional 0x08074b50 signature) and the central directory record (+16).
    std::vector<uint64_t> crc_offsets;
};

/// A parsed archive: entries in central-directory order.
struct ZipArchive {
    uint64_t archive_start = 0;   ///< bytes before the archive (prepended data)
    std::vector<ZipEntry> entries;
    NameIndex index;              ///< entry name -> entries position
    /// Entry by exact name (constant time); nullptr when absent.
    const ZipEntry* find(const std::string& name) const;
};

/// True when the file has a zip end-of-central-directory record in its last 64 KiB + 22 bytes.
bool has_zip_eocd(const InputFile&);

/// Parse the archive through its (ZIP64) end record and central directory. Validates every
/// offset and size against the file size, rejects compressed or encrypted entries, more than
/// limits.max_zip_entries records, and duplicate names. Throws BadInput.
ZipArchive read_zip(const InputFile&, const Limits&);

}  // namespace ckpt::io
