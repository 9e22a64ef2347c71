#include <doctest/doctest.h>
#include "io/checkpoint.h"
TEST_CASE("dtype"){ CHECK(ckpt::dtype_size(ckpt::DType::BF16)==2); }
