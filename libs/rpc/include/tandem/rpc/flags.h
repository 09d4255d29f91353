// The flag parser moved to libs/common (tandem::FlagSet) so that tools without
// gRPC use it too; this name stays for the services and the CLI.
#pragma once

#include "tandem/common/flags.h"

namespace tandem::rpc {
using ::tandem::FlagSet;
}  // namespace tandem::rpc
