// Reads a .npy file with ctxpar's reader and writes it back with ctxpar's writer, so that
// npy_numpy_check.py can compare both directions with NumPy itself. Exit status 3 and the
// ctxpar::Error message on stderr when the reader refuses the file.
#include <iostream>

#include "npy.hpp"

int main(int argc, char* argv[]) {
  if (argc != 3) {
    std::cerr << "usage: npy_copy IN.npy OUT.npy\n";
    return 2;
  }
  try {
    ctxpar::cli::write_npy(argv[2], ctxpar::cli::read_npy(argv[1]));
  } catch (const ctxpar::Error& e) {
    std::cerr << e.what() << "\n";
    return 3;
  }
  return 0;
}
