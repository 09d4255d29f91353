# Warning flags for Tandem's own code. Third-party and CUDA headers come in as
# SYSTEM includes so they cannot break -Werror.
set(TANDEM_CXX_WARNINGS -Wall -Wextra -Werror -Wno-unused-parameter
    # Options structs are built with designated initializers that name only
    # the fields they change; the rest keep their header defaults.
    -Wno-missing-field-initializers)
