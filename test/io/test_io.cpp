// Reader tests against real files written by Debian's torch 1.13 (scripts/make_io_samples.py)
// and the hostile corpus (scripts/make_bad_corpus.py).
#include <doctest/doctest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include <nlohmann/json.hpp>

#include "common/error.h"
#include "io/checkpoint.h"
#include "io/file.h"

using namespace ckpt;
namespace fs = std::filesystem;

namespace {

std::string data_path(const std::string& name) { return std::string(CKPT_SOURCE_DIR) + "/data/io/" + name; }

std::string hex(const std::string& s) {
    static const char* d = "0123456789abcdef";
    std::string out;
    for (unsigned char c : s) { out.push_back(d[c >> 4]); out.push_back(d[c & 15]); }
    return out;
}

/// Compare the reader's view of data/io/<name> with expected-<name>.json written from torch.
void check_expected(const std::string& name) {
    CAPTURE(name);
    std::ifstream in(data_path("expected-" + name + ".json"));
    REQUIRE(in.good());
    auto exp = nlohmann::json::parse(in);
    Checkpoint ck = read_checkpoint(data_path(name));
    CHECK(std::string(format_name(ck.format)) == exp["format"].get<std::string>());
    CHECK(ck.file_size == fs::file_size(data_path(name)));
    REQUIRE(ck.tensors.size() == exp["tensors"].size());
    REQUIRE(ck.storages.size() == exp["storages"].size());
    std::map<std::size_t, std::size_t> group, back;   // reader storage <-> expected storage
    for (std::size_t i = 0; i < ck.tensors.size(); ++i) {
        const auto& t = ck.tensors[i];
        const auto& e = exp["tensors"][i];
        CAPTURE(t.path);
        CHECK(t.path == e["path"].get<std::string>());
        CHECK(std::string(dtype_name(t.dtype)) == e["dtype"].get<std::string>());
        CHECK(t.shape == e["shape"].get<std::vector<int64_t>>());
        CHECK(t.stride == e["stride"].get<std::vector<int64_t>>());
        CHECK(t.storage_offset == e["offset"].get<int64_t>());
        std::size_t es = e["storage"].get<std::size_t>();
        auto [it, fresh] = group.emplace(t.storage, es);
        CHECK(it->second == es);                      // same reader storage -> same torch storage
        auto [jt, fresh2] = back.emplace(es, t.storage);
        CHECK(jt->second == t.storage);               // and the other way round
    }
    CHECK(group.size() == ck.storages.size());
    io::InputFile f(data_path(name));
    for (std::size_t i = 0; i < ck.storages.size(); ++i) {
        const auto& s = ck.storages[i];
        CAPTURE(s.key);
        if (i > 0) CHECK(ck.storages[i - 1].file_offset + ck.storages[i - 1].nbytes <= s.file_offset);
        const auto& e = exp["storages"][group.at(i)];
        CHECK(std::string(dtype_name(s.dtype)) == e["dtype"].get<std::string>());
        CHECK(s.numel == e["numel"].get<uint64_t>());
        CHECK(s.nbytes == e["nbytes"].get<uint64_t>());
        CHECK(hex(f.read_string(s.file_offset, s.nbytes, "test")) == e["hex"].get<std::string>());
        if (e.contains("key")) CHECK(s.key == e["key"].get<std::string>());
        if (e.contains("file_offset")) CHECK(s.file_offset == e["file_offset"].get<uint64_t>());
        if (e.contains("crc")) {
            REQUIRE(s.crc_offsets.size() == 2);   // data descriptor + central directory (flag bit 3 set)
            for (auto off : s.crc_offsets) CHECK(f.u32(off, "test") == e["crc"].get<uint32_t>());
        } else {
            CHECK(s.crc_offsets.empty());
        }
    }
}

const Value& at(const Value& v, std::initializer_list<const char*> keys) {
    const Value* cur = &v;
    for (auto k : keys) {
        cur = cur->get(k);
        REQUIRE_MESSAGE(cur != nullptr, k);
    }
    return *cur;
}

}  // namespace

TEST_CASE("dtype helpers") {
    CHECK(dtype_size(DType::BF16) == 2);
    CHECK(dtype_size(DType::C128) == 16);
    CHECK(dtype_size(DType::Bool) == 1);
    CHECK(std::string(dtype_name(DType::Bool)) == "BOOL");
    CHECK(dtype_from_name("F8_E4M3") == DType::F8_E4M3);
    CHECK(!dtype_from_name("F4").has_value());
    CHECK(std::string(format_name(Format::TorchLegacy)) == "torch-legacy");
}

TEST_CASE("torch zip saved to a path: nested model/optimizer/epoch") {
    check_expected("nested.pt");
    Checkpoint ck = read_checkpoint(data_path("nested.pt"));
    CHECK(std::get<int64_t>(at(ck.root, {"epoch"}).v) == 3);
    const auto& groups = std::get<Value::List>(at(ck.root, {"optimizer", "param_groups"}).v);
    REQUIRE(groups.size() == 1);
    CHECK(std::get<double>(at(groups[0], {"lr"}).v) == 1e-3);
    CHECK(std::get<double>(at(groups[0], {"weight_decay"}).v) == 0.01);
    CHECK(std::get<bool>(at(groups[0], {"amsgrad"}).v) == true);
    const auto& betas = at(groups[0], {"betas"});
    CHECK(betas.is_tuple);
    CHECK(std::get<double>(std::get<Value::List>(betas.v)[1].v) == 0.999);
    const auto& params = std::get<Value::List>(at(groups[0], {"params"}).v);
    REQUIRE(params.size() == 6);
    CHECK(std::get<int64_t>(params[5].v) == 5);
    // The OrderedDict's BUILD state (_metadata) is not an item.
    CHECK(ck.root.get("model")->get("_metadata") == nullptr);
    CHECK(std::get<Value::Dict>(ck.root.get("model")->v).size() == 9);
    // int keys of optimizer state are addressable by their text; step is a 0-d tensor.
    const auto& step = at(ck.root, {"optimizer", "state", "4", "step"});
    const auto& ti = ck.tensors.at(std::get<Value::Tensor>(step.v).index);
    CHECK(ti.path == "optimizer/state/4/step");
    CHECK(ti.shape.empty());
    CHECK(at(ck.root, {"optimizer", "state", "4"}).get("max_exp_avg_sq") != nullptr);
    CHECK(ck.tensors[std::get<Value::Tensor>(at(ck.root, {"model", "1.num_batches_tracked"}).v).index].dtype ==
          DType::I64);
}

TEST_CASE("torch zip with bytes prepended reads like the original") {
    check_expected("prepended.pt");
    Checkpoint a = read_checkpoint(data_path("nested.pt"));
    Checkpoint b = read_checkpoint(data_path("prepended.pt"));
    REQUIRE(a.storages.size() == b.storages.size());
    for (std::size_t i = 0; i < a.storages.size(); ++i) CHECK(b.storages[i].file_offset == a.storages[i].file_offset + 100);
}

TEST_CASE("optimizer-only state dict with int steps") {
    check_expected("optim_only.pt");
    Checkpoint ck = read_checkpoint(data_path("optim_only.pt"));
    CHECK(std::get<int64_t>(at(ck.root, {"state", "0", "step"}).v) == 2);
    CHECK(ck.tensors.front().path == "state/0/exp_avg");
}

TEST_CASE("torch zip saved to a stream: every dtype, views, shared storage, 0-d") {
    check_expected("dtypes.pt");
    Checkpoint ck = read_checkpoint(data_path("dtypes.pt"));
    const auto& b = at(ck.root, {"bytes"});
    CHECK(b.is_bytes);
    CHECK(std::get<std::string>(b.v) == std::string("ab\xff\0", 4));
    const auto& l = std::get<Value::List>(at(ck.root, {"nested"}).v);
    REQUIRE(l.size() == 6);
    CHECK(!at(ck.root, {"nested"}).is_tuple);
    CHECK(std::get<int64_t>(l[0].v) == 1);
    CHECK(std::get<double>(l[1].v) == 2.5);
    CHECK(std::holds_alternative<Value::None>(l[2].v));
    CHECK(std::get<bool>(l[3].v) == true);
    CHECK(std::get<std::string>(l[4].v) == "s");
    CHECK(l[5].is_tuple);
    CHECK(std::get<std::string>(std::get<Value::List>(l[5].v)[1].v) == "t");
}

TEST_CASE("legacy (non-zip) torch file") {
    check_expected("legacy.pt");
    Checkpoint ck = read_checkpoint(data_path("legacy.pt"));
    CHECK(ck.format == Format::TorchLegacy);
    CHECK(std::get<std::string>(at(ck.root, {"bytes"}).v) == std::string("ab\xff\0", 4));
}

TEST_CASE("safetensors written by hand") {
    check_expected("tensors.safetensors");
    Checkpoint ck = read_checkpoint(data_path("tensors.safetensors"));
    const auto& md = at(ck.root, {"__metadata__"});
    CHECK(std::get<std::string>(at(md, {"format"}).v) == "pt");
    CHECK(std::get<std::string>(at(md, {"note"}).v) == "ckptkit");
    CHECK(std::get<Value::Dict>(ck.root.v).size() == 6);
}

TEST_CASE("every file of the hostile corpus is BadInput with its expected message, nothing executed") {
    const std::string dir = std::string(CKPT_SOURCE_DIR) + "/test/corpus/bad";
    std::ifstream in(std::string(CKPT_SOURCE_DIR) + "/test/corpus/bad_expected.json");
    REQUIRE(in.good());
    auto expected = nlohmann::json::parse(in);
    const char* pwned[] = {"/tmp/ckpt_pwned_os", "/tmp/ckpt_pwned_posix", "/tmp/ckpt_pwned_eval",
                           "/tmp/ckpt_pwned_stack", "/tmp/ckpt_pwned_legacy"};
    for (auto p : pwned) std::remove(p);
    std::set<std::string> files;
    for (const auto& e : fs::directory_iterator(dir))
        if (e.path().filename() != "README.md") files.insert(e.path().filename().string());
    CHECK(files.size() == expected.size());
    CHECK(files.size() >= 90);
    for (const auto& name : files) {
        CAPTURE(name);
        REQUIRE(expected.contains(name));
        const std::string want = expected[name].get<std::string>();
        std::string got;
        CHECK_THROWS_AS(
            [&] {
                try {
                    read_checkpoint(dir + "/" + name);
                } catch (const BadInput& e) {
                    got = e.what();
                    CHECK(e.file == dir + "/" + name);
                    throw;
                }
            }(),
            BadInput);
        CAPTURE(got);
        CHECK(got.find(want) != std::string::npos);
        CHECK(got.find('\n') == std::string::npos);
    }
    for (auto p : pwned) CHECK_MESSAGE(!fs::exists(p), p);
}

TEST_CASE("Limits are enforced on good files") {
    Limits l;
    l.max_memo_entries = 10;
    CHECK_THROWS_WITH_AS(read_checkpoint(data_path("nested.pt"), l), doctest::Contains("memo exceeds 10 entries"),
                         BadInput);
    l = {};
    l.max_objects = 50;
    CHECK_THROWS_WITH_AS(read_checkpoint(data_path("nested.pt"), l), doctest::Contains("more than 50 objects"),
                         BadInput);
    l = {};
    l.max_zip_entries = 5;
    CHECK_THROWS_WITH_AS(read_checkpoint(data_path("nested.pt"), l), doctest::Contains("more than the limit 5"),
                         BadInput);
    l = {};
    l.max_pickle_bytes = 100;
    CHECK_THROWS_WITH_AS(read_checkpoint(data_path("nested.pt"), l), doctest::Contains("more than the limit 100"),
                         BadInput);
    CHECK_THROWS_WITH_AS(read_checkpoint(data_path("legacy.pt"), l), doctest::Contains("longer than 100 bytes"),
                         BadInput);
    l = {};
    l.max_header_bytes = 64;
    CHECK_THROWS_WITH_AS(read_checkpoint(data_path("tensors.safetensors"), l),
                         doctest::Contains("exceeds the limit of 64 bytes"), BadInput);
    CHECK_THROWS_WITH_AS(read_checkpoint("/nonexistent/ckpt.pt"), doctest::Contains("cannot open"), BadInput);
}

TEST_CASE("zip variants: ZIP64 extras + descriptors without signature + comment; no descriptors") {
    // Same objects as dtypes.pt, re-zipped by hand (scripts/make_io_samples.py hand_zip) and by
    // Python's zipfile (CRC in the local header). torch.load accepts both.
    check_expected("handzip.pt");
    check_expected("rezipped.pt");
    Checkpoint a = read_checkpoint(data_path("handzip.pt"));
    Checkpoint b = read_checkpoint(data_path("rezipped.pt"));
    // handzip: descriptor CRC sits right after the data (no signature); rezipped: local header + 14.
    CHECK(a.storages[0].crc_offsets[0] == a.storages[0].file_offset + a.storages[0].nbytes);
    CHECK(b.storages[0].crc_offsets[0] < b.storages[0].file_offset);
    CHECK(b.storages[0].file_offset - b.storages[0].crc_offsets[0] == 30 - 14 + std::string("archive/data/0").size());
}

TEST_CASE("hand-made valid pickles: allowlisted globals render as values") {
    // torch 1.13 loads this file as {'size': torch.Size([2, 3]), 'dev': device('cuda:1'),
    // 'dt': torch.bfloat16, 'set': {1, 2}, 'cplx': (1.5-2j), 'ba': bytearray(b'a\xff'),
    // 'big': 2**64, 'neg': -1, 'od': OrderedDict([('k', 1), ('j', None)])}.
    Checkpoint ck = read_checkpoint(std::string(CKPT_SOURCE_DIR) + "/test/corpus/good/globals.pt");
    CHECK(ck.storages.empty());
    const auto& size = at(ck.root, {"size"});
    CHECK(size.is_tuple);
    const auto& dims = std::get<Value::List>(size.v);
    REQUIRE(dims.size() == 2);
    CHECK(std::get<int64_t>(dims[0].v) == 2);
    CHECK(std::get<int64_t>(dims[1].v) == 3);
    CHECK(std::get<std::string>(at(ck.root, {"dev"}).v) == "cuda:1");
    CHECK(std::get<std::string>(at(ck.root, {"dt"}).v) == "torch.bfloat16");
    const auto& set = std::get<Value::List>(at(ck.root, {"set"}).v);
    REQUIRE(set.size() == 2);
    CHECK(std::get<int64_t>(set[1].v) == 2);
    const auto& c = std::get<Value::List>(at(ck.root, {"cplx"}).v);
    REQUIRE(c.size() == 2);
    CHECK(std::get<double>(c[0].v) == 1.5);
    CHECK(std::get<double>(c[1].v) == -2.0);
    CHECK(at(ck.root, {"ba"}).is_bytes);
    CHECK(std::get<std::string>(at(ck.root, {"ba"}).v) == "a\xff");
    CHECK(std::get<double>(at(ck.root, {"big"}).v) == 18446744073709551616.0);
    CHECK(std::get<int64_t>(at(ck.root, {"neg"}).v) == -1);
    const auto& od = std::get<Value::Dict>(at(ck.root, {"od"}).v);
    REQUIRE(od.size() == 2);
    CHECK(std::get<std::string>(od[1].first.v) == "j");
    CHECK(std::holds_alternative<Value::None>(od[1].second.v));
}

TEST_CASE("hand-made protocol 4 pickle: _rebuild_parameter(_rebuild_tensor_v3(UntypedStorage))") {
    Checkpoint ck = read_checkpoint(std::string(CKPT_SOURCE_DIR) + "/test/corpus/good/v3_param.pt");
    REQUIRE(ck.storages.size() == 1);
    REQUIRE(ck.tensors.size() == 1);
    CHECK(ck.storages[0].dtype == DType::U8);   // untyped: numel in bytes
    CHECK(ck.storages[0].numel == 12);
    const auto& t = ck.tensors[0];
    CHECK(t.path == "p");
    CHECK(t.dtype == DType::F32);
    CHECK(t.storage_offset == 1);
    CHECK(t.shape == std::vector<int64_t>{2});
    CHECK(t.stride == std::vector<int64_t>{1});
    CHECK(std::get<Value::Tensor>(at(ck.root, {"p"}).v).index == 0);
}
