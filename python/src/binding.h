// What the parts of ringmaster._ringmaster share (binding.cc defines the module).
#pragma once

#include <pybind11/pybind11.h>

#include <memory>

#include "ringmaster/client.h"

namespace ringmaster::python {

// The C++ client behind a ringmaster._ringmaster.Client (binding.cc).
std::shared_ptr<Client> ClientOf(pybind11::handle py_client);

// ringmaster._ringmaster.MxnetEngine (mxnet_engine.cc).
void DefineMxnetEngine(pybind11::module_& m);

}  // namespace ringmaster::python
