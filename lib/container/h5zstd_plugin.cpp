// HDF5 dynamic filter plugin for zstd (id 32015) so h5py / h5dump read our containers:
//   HDF5_PLUGIN_PATH=<build>/lib/container python3 -c 'import h5py; h5py.File(...)'
// Debian 12 ships no zstd HDF5 plugin; this exports the same filter the tools use.
#include <H5PLextern.h>

#include "container/h5.h"

extern "C" {
H5PL_type_t H5PLget_plugin_type(void) { return H5PL_TYPE_FILTER; }
const void* H5PLget_plugin_info(void) { return &ckpt::container::kZstdClass; }
}
