// Reading and writing NumPy `.npy` files: the format the `ctxpar` tool exchanges tensors in, so a
// user can check ctxpar against a PyTorch/NumPy model (`np.save` / `np.load`).
//
// Supported: format versions 1.0 and 2.0, C order, little-endian float32 (`<f4`), float64 (`<f8`),
// IEEE half (`<f2`), bfloat16 and int32 (`<i4`), any rank (including 0-d). NumPy has no bfloat16
// dtype: a bfloat16 tensor is stored as its raw 16-bit patterns in a `<u2` (uint16) array, the
// upper halves of the fp32 values (PyTorch: `t.view(torch.int16).numpy().view('<u2')`, and back
// `torch.from_numpy(a.view('<i2')).view(torch.bfloat16)`); so every `<u2` file is read as bfloat16.
// Anything else — another dtype, big-endian data, Fortran order, version 3.0, a malformed header, a
// truncated file — is a ctxpar::Error naming the file, what was expected and what was found.
// Written files use version 1.0 (2.0 when the header does not fit), with the header padded so the
// data starts at a multiple of 64 bytes.
#pragma once

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <ostream>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include "ctxpar/core/bfloat16.hpp"
#include "ctxpar/core/error.hpp"
#include "ctxpar/core/float16.hpp"
#include "ctxpar/core/storage.hpp"
#include "files.hpp"

namespace ctxpar::cli {

/// Element types of a `.npy` file the tool understands.
enum class Dtype { float32, float64, int32, float16, bfloat16 };

/// NumPy's `descr` of a dtype (`"<f4"`, `"<f8"`, `"<i4"`, `"<f2"`; bfloat16: `"<u2"`).
inline const char* descr(Dtype d) {
  switch (d) {
    case Dtype::float32:
      return "<f4";
    case Dtype::float64:
      return "<f8";
    case Dtype::int32:
      return "<i4";
    case Dtype::float16:
      return "<f2";
    case Dtype::bfloat16:
      return "<u2";
  }
  return "?";
}

/// The dtype's name in summaries (`float32`, `bfloat16`, ...).
inline const char* dtype_name(Dtype d) {
  switch (d) {
    case Dtype::float32:
      return "float32";
    case Dtype::float64:
      return "float64";
    case Dtype::int32:
      return "int32";
    case Dtype::float16:
      return "float16";
    case Dtype::bfloat16:
      return "bfloat16";
  }
  return "?";
}

/// Bytes per element of a dtype.
inline std::size_t element_size(Dtype d) {
  return d == Dtype::float64 ? 8 : d == Dtype::float16 || d == Dtype::bfloat16 ? 2 : 4;
}

/// The dtype of a C++ scalar type (float, double, std::int32_t, ctxpar::float16,
/// ctxpar::bfloat16).
template <class T>
constexpr Dtype dtype_of() {
  using U = std::remove_cv_t<T>;
  static_assert(std::is_same_v<U, float> || std::is_same_v<U, double> ||
                    std::is_same_v<U, std::int32_t> || std::is_same_v<U, ctxpar::float16> ||
                    std::is_same_v<U, ctxpar::bfloat16>,
                "ctxpar::cli::npy: the element type must be float, double, std::int32_t, "
                "ctxpar::float16 or ctxpar::bfloat16");
  if constexpr (std::is_same_v<U, float>) {
    return Dtype::float32;
  } else if constexpr (std::is_same_v<U, double>) {
    return Dtype::float64;
  } else if constexpr (std::is_same_v<U, ctxpar::float16>) {
    return Dtype::float16;
  } else if constexpr (std::is_same_v<U, ctxpar::bfloat16>) {
    return Dtype::bfloat16;
  } else {
    return Dtype::int32;
  }
}

/// A tensor read from or to be written to a `.npy` file: dtype, shape (C order) and the raw
/// little-endian bytes.
class NpyArray {
 public:
  NpyArray() = default;

  /// An array of `shape` holding `values` (their count must match the shape).
  template <class T>
  static NpyArray from_values(std::vector<std::int64_t> shape, const std::vector<T>& values) {
    NpyArray a;
    a.dtype_ = dtype_of<T>();
    a.shape_ = std::move(shape);
    require_local(static_cast<std::int64_t>(values.size()) == a.size(), "ctxpar::cli::NpyArray",
                  "the number of values must match the shape", a.size(), values.size());
    a.bytes_.resize(values.size() * sizeof(T));
    if (!values.empty()) std::memcpy(a.bytes_.data(), values.data(), a.bytes_.size());
    return a;
  }

  /// An array from raw parts, as the reader builds it.
  NpyArray(Dtype dtype, std::vector<std::int64_t> shape, std::vector<char> bytes)
      : dtype_(dtype), shape_(std::move(shape)), bytes_(std::move(bytes)) {}

  /// Element type.
  Dtype dtype() const noexcept { return dtype_; }
  /// Extents in C order (empty for a 0-d array).
  const std::vector<std::int64_t>& shape() const noexcept { return shape_; }
  /// Number of dimensions.
  int rank() const noexcept { return static_cast<int>(shape_.size()); }
  /// Extent of dimension `d`.
  std::int64_t extent(int d) const { return shape_.at(static_cast<std::size_t>(d)); }
  /// Number of elements (1 for a 0-d array).
  std::int64_t size() const {
    std::int64_t n = 1;
    for (auto e : shape_) n *= e;
    return n;
  }
  /// The raw data bytes.
  const std::vector<char>& bytes() const noexcept { return bytes_; }

  /// Typed access to the data; throws unless the file's dtype is exactly `T`'s.
  template <class T>
  const T* data(const std::string& what = "the array") const {
    require_dtype<T>(what);
    return reinterpret_cast<const T*>(bytes_.data());
  }

  /// The elements as a `std::vector<T>`; throws unless the dtype is exactly `T`'s.
  template <class T>
  std::vector<T> values(const std::string& what = "the array") const {
    const T* p = data<T>(what);
    return std::vector<T>(p, p + size());
  }

  /// Throws unless the dtype is `T`'s, naming `what` (e.g. the option the file came from).
  template <class T>
  void require_dtype(const std::string& what) const {
    require_local(dtype_ == dtype_of<T>(), "ctxpar::cli::npy", what + " has the wrong dtype",
                  descr(dtype_of<T>()), descr(dtype_));
  }

  /// Throws unless the shape is `expected`, naming `what`.
  void require_shape(const std::vector<std::int64_t>& expected, const std::string& what) const {
    require_local(shape_ == expected, "ctxpar::cli::npy", what + " has the wrong shape",
                  shape_text(expected), shape_text(shape_));
  }

  /// Same, for a braced list `{t, h, d}`. This overload exists because nvcc 11.8 mistranslates a
  /// braced list of a dependent object's members passed as `const std::vector&` inside a template.
  void require_shape(std::initializer_list<std::int64_t> expected, const std::string& what) const {
    require_shape(std::vector<std::int64_t>(expected), what);
  }

  /// A shape as NumPy prints it, e.g. `(3, 4)`, `(5,)`, `()`.
  static std::string shape_text(const std::vector<std::int64_t>& shape) {
    std::string s = "(";
    for (std::size_t i = 0; i < shape.size(); ++i) {
      s += std::to_string(shape[i]);
      if (i + 1 < shape.size() || shape.size() == 1) s += ",";
      if (i + 1 < shape.size()) s += " ";
    }
    return s + ")";
  }

 private:
  Dtype dtype_ = Dtype::float32;
  std::vector<std::int64_t> shape_;
  std::vector<char> bytes_;
};

namespace impl {

[[noreturn]] inline void npy_fail(const std::string& path, const std::string& condition,
                                  const std::string& expected, const std::string& actual) {
  throw Error("ctxpar::cli::read_npy", -1, path + ": " + condition, expected, actual);
}

// The header dictionary, parsed strictly: exactly the keys 'descr', 'fortran_order' and 'shape',
// each once (NumPy requires these keys; a duplicate, which Python resolves to the last value, is
// refused rather than guessed), then only padding. Values are kept as text: the quoted descr,
// True/False, and the shape tuple's items.
struct NpyHeader {
  std::string descr, fortran;
  std::vector<std::int64_t> shape;
  std::string shape_text;
};

inline NpyHeader parse_header(const std::string& path, const std::string& h) {
  std::size_t i = 0;
  auto fail = [&](const std::string& what, const std::string& expected) {
    npy_fail(path, "malformed header: " + what, expected, h);
  };
  auto skip = [&] {
    while (i < h.size() && (h[i] == ' ' || h[i] == '\t')) ++i;
  };
  auto quoted = [&]() {
    if (i >= h.size() || (h[i] != '\'' && h[i] != '"')) fail("a quoted string expected", "'...'");
    const char q = h[i];
    const auto close = h.find(q, i + 1);
    if (close == std::string::npos) fail("an unterminated string", "'...'");
    std::string v = h.substr(i + 1, close - i - 1);
    i = close + 1;
    return v;
  };
  NpyHeader out;
  bool seen[3] = {false, false, false};
  skip();
  if (i >= h.size() || h[i] != '{') fail("not a dictionary", "{...}");
  ++i;
  for (;;) {
    skip();
    if (i < h.size() && h[i] == '}') break;
    const std::string key = quoted();
    const int k = key == "descr" ? 0 : key == "fortran_order" ? 1 : key == "shape" ? 2 : -1;
    if (k < 0) fail("unknown key '" + key + "'", "only 'descr', 'fortran_order' and 'shape'");
    if (seen[k]) fail("the key '" + key + "' appears twice", "each key once");
    seen[k] = true;
    skip();
    if (i >= h.size() || h[i] != ':') fail("':' expected after '" + key + "'", "'key': value");
    ++i;
    skip();
    if (k == 0) {
      out.descr = "'" + quoted() + "'";
    } else if (k == 1) {
      const auto e = h.find_first_of(",} ", i);
      out.fortran = h.substr(i, e == std::string::npos ? std::string::npos : e - i);
      i = e == std::string::npos ? h.size() : e;
    } else {
      if (i >= h.size() || h[i] != '(') npy_fail(path, "malformed shape", "a tuple", h.substr(i));
      const auto close = h.find(')', i);
      if (close == std::string::npos) npy_fail(path, "malformed shape", "a tuple", h.substr(i));
      out.shape_text = h.substr(i, close - i + 1);
      // Items separated by commas; one trailing comma allowed, and required for one item
      // ("(5)" is an integer in Python, not a tuple); no empty item ("(12,,2)", "(,)").
      const std::string inner = h.substr(i + 1, close - i - 1);
      std::size_t j = 0;
      bool trailing_comma = false;
      while (j < inner.size()) {
        while (j < inner.size() && inner[j] == ' ') ++j;
        if (j >= inner.size()) break;
        std::size_t e = j;
        while (e < inner.size() && inner[e] >= '0' && inner[e] <= '9') ++e;
        const std::string digits = inner.substr(j, e - j);
        if (e < inner.size() && inner[e] == 'L') ++e;  // Python 2's long suffix
        while (e < inner.size() && inner[e] == ' ') ++e;
        if (digits.empty() || digits.size() > 18 || (e < inner.size() && inner[e] != ','))
          npy_fail(path, "malformed shape", "non-negative integers separated by commas",
                   out.shape_text);
        out.shape.push_back(std::stoll(digits));
        trailing_comma = e < inner.size();
        j = e + (trailing_comma ? 1 : 0);
      }
      if (out.shape.empty() ? inner.find_first_not_of(' ') != std::string::npos
                            : out.shape.size() == 1 && !trailing_comma)
        npy_fail(path, "malformed shape", "a tuple such as (), (5,) or (3, 4)", out.shape_text);
      i = close + 1;
    }
    skip();
    if (i < h.size() && h[i] == ',') {
      ++i;
      continue;
    }
    skip();
    if (i < h.size() && h[i] == '}') break;
    fail("',' or '}' expected after '" + key + "'", "a dictionary");
  }
  ++i;
  if (h.find_first_not_of(" \t\n", i) != std::string::npos)
    fail("bytes after the dictionary", "spaces and a newline");
  const char* names[3] = {"'descr'", "'fortran_order'", "'shape'"};
  for (int k = 0; k < 3; ++k)
    if (!seen[k])
      npy_fail(path, std::string("the header has no ") + names[k] + " entry",
               std::string("a key ") + names[k], h);
  return out;
}

}  // namespace impl

/// Reads a `.npy` file. Throws `ctxpar::Error` on an unsupported or malformed file. The magic,
/// the header and the file's size against the shape are checked before the data is read.
inline NpyArray read_npy(const std::string& path) {
  // A directory opens as a stream on Linux and then reads as zero bytes, and a FIFO would block:
  // only a regular file is opened, and anything else is named for what it is.
  const InputFile in(path);
  if (!in.problem().empty()) {
    const bool missing = in.problem() == "no such file";
    impl::npy_fail(path, missing ? "cannot open the file" : in.problem(),
                   missing ? "a readable .npy file" : "a .npy file (a regular file)", in.problem());
  }
  const std::int64_t file_size = in.size();
  if (file_size == 0) impl::npy_fail(path, "empty file", "a .npy file", "0 bytes");
  char prefix[12] = {};
  const auto prefix_size = static_cast<std::size_t>(std::min<std::int64_t>(file_size, 12));
  if (!in.read_at(0, prefix, prefix_size))
    impl::npy_fail(path, "cannot read the file", "a readable .npy file", "a read error");
  if (file_size < 10 || std::string(prefix, 6) != "\x93NUMPY") {
    impl::npy_fail(path, "not a .npy file (bad magic string)", "\\x93NUMPY", "other bytes");
  }
  const int major = static_cast<unsigned char>(prefix[6]);
  const int minor = static_cast<unsigned char>(prefix[7]);
  std::int64_t header_len = 0, offset = 0;
  if (major == 1) {
    header_len = static_cast<unsigned char>(prefix[8]) |
                 (static_cast<std::int64_t>(static_cast<unsigned char>(prefix[9])) << 8);
    offset = 10;
  } else if (major == 2) {
    if (file_size < 12)
      impl::npy_fail(path, "truncated header", "at least 12 bytes",
                     std::to_string(file_size) + " bytes");
    for (int i = 0; i < 4; ++i)
      header_len |= static_cast<std::int64_t>(static_cast<unsigned char>(prefix[8 + i])) << (8 * i);
    offset = 12;
  } else {
    impl::npy_fail(path, "unsupported .npy format version", "1.0 or 2.0",
                   std::to_string(major) + "." + std::to_string(minor));
  }
  if (file_size < offset + header_len) {
    impl::npy_fail(path, "truncated header", std::to_string(offset + header_len) + " bytes",
                   std::to_string(file_size) + " bytes");
  }
  std::string header(static_cast<std::size_t>(header_len), '\0');
  if (!in.read_at(offset, header.data(), header.size()))
    impl::npy_fail(path, "cannot read the header", "a readable .npy file", "a read error");
  const impl::NpyHeader h = impl::parse_header(path, header);
  const std::string& descr_text = h.descr;
  const std::string& shape_text = h.shape_text;
  Dtype dtype;
  if (descr_text == "'<f4'") {
    dtype = Dtype::float32;
  } else if (descr_text == "'<f8'") {
    dtype = Dtype::float64;
  } else if (descr_text == "'<i4'") {
    dtype = Dtype::int32;
  } else if (descr_text == "'<f2'") {
    dtype = Dtype::float16;
  } else if (descr_text == "'<u2'") {
    dtype = Dtype::bfloat16;
  } else {
    impl::npy_fail(path, "unsupported dtype",
                   "'<f4', '<f8', '<f2', '<u2' or '<i4' (little-endian float32, float64, float16, "
                   "bfloat16 bit patterns, int32)",
                   descr_text);
  }
  if (h.fortran != "False") {
    impl::npy_fail(path, "only C-order arrays are supported", "fortran_order False", h.fortran);
  }
  std::vector<std::int64_t> shape = h.shape;
  // The element count of a hostile header can wrap around; no real file holds 2^62 bytes, so a
  // byte count past that is refused before it is compared with the file's size.
  constexpr std::int64_t max_bytes = std::int64_t(1) << 62;
  const auto esize = static_cast<std::int64_t>(element_size(dtype));
  std::int64_t count = 1;
  bool zero = false;
  for (auto e : shape) zero = zero || e == 0;
  for (auto e : shape) {
    if (zero) break;
    if (count > max_bytes / esize / e)
      impl::npy_fail(path, "the shape's byte count overflows", "at most 2^62 data bytes",
                     shape_text);
    count *= e;
  }
  if (zero) count = 0;
  const std::int64_t data_begin = offset + header_len;
  const std::int64_t expected = count * esize;
  const std::int64_t have = file_size - data_begin;
  if (have < expected) {
    impl::npy_fail(path, "truncated data",
                   std::to_string(expected) + " data bytes for shape " + shape_text,
                   std::to_string(have) + " data bytes");
  }
  if (have > expected) {
    impl::npy_fail(path, "trailing bytes after the data", std::to_string(expected) + " data bytes",
                   std::to_string(have) + " data bytes");
  }
  std::vector<char> data(static_cast<std::size_t>(expected));
  if (expected > 0 && !in.read_at(data_begin, data.data(), data.size()))
    impl::npy_fail(path, "cannot read the data", std::to_string(expected) + " data bytes",
                   "a short read");
  return NpyArray(dtype, std::move(shape), std::move(data));
}

/// Writes `array` in the `.npy` format to `out` (version 1.0, or 2.0 if the header needs it).
inline void write_npy(std::ostream& out, const NpyArray& array) {
  std::string dict = std::string("{'descr': '") + descr(array.dtype()) +
                     "', 'fortran_order': False, 'shape': " + NpyArray::shape_text(array.shape()) +
                     ", }";
  // Pad with spaces and end with a newline so the data starts 64-byte aligned, as NumPy does.
  auto pad_to = [&](std::size_t prefix) {
    std::string h = dict;
    const std::size_t total = prefix + h.size() + 1;
    h.append((64 - total % 64) % 64, ' ');
    h += '\n';
    return h;
  };
  std::string header = pad_to(10);
  int major = 1;
  if (header.size() > 65535) {
    major = 2;
    header = pad_to(12);
  }
  out.write("\x93NUMPY", 6);
  out.put(static_cast<char>(major));
  out.put(0);
  const std::size_t len = header.size();
  const int len_bytes = major == 1 ? 2 : 4;
  for (int i = 0; i < len_bytes; ++i) out.put(static_cast<char>((len >> (8 * i)) & 0xff));
  out.write(header.data(), static_cast<std::streamsize>(header.size()));
  out.write(array.bytes().data(), static_cast<std::streamsize>(array.bytes().size()));
}

/// Writes `array` to `path` (version 1.0, or 2.0 if the header needs it) through a fresh
/// temporary renamed into place (`StagedFiles`): `path` is complete or untouched. Throws on an
/// I/O error or when `path` is not a regular file.
inline void write_npy(const std::string& path, const NpyArray& array) {
  std::ostringstream out;
  write_npy(out, array);
  StagedFiles staged;
  std::string problem = staged.stage(path, out.str());
  if (problem.empty()) problem = staged.commit();
  require_local(problem.empty(), "ctxpar::cli::write_npy", path + ": cannot write",
                "the file written", problem);
}

/// Calls `f(T{})` with the C++ type of a floating-point dtype `d` (float, double,
/// ctxpar::float16, ctxpar::bfloat16); int32 is not one.
template <class F>
decltype(auto) with_float_type(Dtype d, F&& f) {
  switch (d) {
    case Dtype::float64:
      return f(double{});
    case Dtype::float16:
      return f(ctxpar::float16{});
    case Dtype::bfloat16:
      return f(ctxpar::bfloat16{});
    default:
      require_local(d == Dtype::float32, "ctxpar::cli::npy", "a floating-point dtype is needed",
                    "'<f4', '<f8', '<f2' or '<u2'", descr(d));
      return f(float{});
  }
}

/// The elements of a float32, float64, float16, bfloat16 or int32 array as doubles (exact).
inline std::vector<double> values_as_double(const NpyArray& a, const std::string& what) {
  std::vector<double> out(static_cast<std::size_t>(a.size()));
  if (a.dtype() == Dtype::int32) {
    const std::int32_t* p = a.data<std::int32_t>(what);
    for (std::size_t i = 0; i < out.size(); ++i) out[i] = p[i];
    return out;
  }
  with_float_type(a.dtype(), [&](auto tag) {
    const auto* p = a.data<decltype(tag)>(what);
    for (std::size_t i = 0; i < out.size(); ++i) out[i] = static_cast<double>(ctxpar::widen(p[i]));
  });
  return out;
}

/// Writes `n = prod(shape)` values starting at `data`.
template <class T>
void write_npy(const std::string& path, const T* data, const std::vector<std::int64_t>& shape) {
  std::int64_t n = 1;
  for (auto e : shape) n *= e;
  write_npy(path, NpyArray::from_values(shape, std::vector<T>(data, data + n)));
}

/// Reads a `.npy` file into a new view of type `View` (any memory space, LayoutRight or rank 1):
/// the dtype must be `View`'s scalar type and the rank must match; the extents come from the file.
template <class View>
View read_view(const std::string& path, const std::string& label) {
  using value_type = typename View::non_const_value_type;
  const NpyArray a = read_npy(path);
  a.require_dtype<value_type>(path);
  constexpr int rank = static_cast<int>(View::rank);
  require_local(a.rank() == rank, "ctxpar::cli::read_view",
                path + " has the wrong number of dimensions", rank, a.rank());
  static_assert(static_cast<int>(View::rank) <= 8, "ctxpar::cli::read_view: at most 8 dimensions");
  std::size_t e[8] = {KOKKOS_INVALID_INDEX, KOKKOS_INVALID_INDEX, KOKKOS_INVALID_INDEX,
                      KOKKOS_INVALID_INDEX, KOKKOS_INVALID_INDEX, KOKKOS_INVALID_INDEX,
                      KOKKOS_INVALID_INDEX, KOKKOS_INVALID_INDEX};
  for (int d = 0; d < rank; ++d) e[d] = static_cast<std::size_t>(a.extent(d));
  View v(Kokkos::view_alloc(Kokkos::WithoutInitializing, label), e[0], e[1], e[2], e[3], e[4], e[5],
         e[6], e[7]);
  auto host = Kokkos::create_mirror_view(v);
  static_assert(std::is_same_v<typename View::array_layout, Kokkos::LayoutRight> || View::rank <= 1,
                "ctxpar::cli::read_view: the view must be LayoutRight (C order) or rank 1");
  if (a.size() > 0) std::memcpy(host.data(), a.bytes().data(), a.bytes().size());
  Kokkos::deep_copy(v, host);
  return v;
}

/// Writes a contiguous LayoutRight (or rank-1) view of float, double or int32 to `path`.
template <class View>
void write_view(const std::string& path, const View& view) {
  using value_type = typename View::non_const_value_type;
  static_assert(std::is_same_v<typename View::array_layout, Kokkos::LayoutRight> || View::rank <= 1,
                "ctxpar::cli::write_view: the view must be LayoutRight (C order) or rank 1");
  require_local(view.span_is_contiguous(), "ctxpar::cli::write_view", "the view must be contiguous",
                "a contiguous view", "a strided view");
  auto host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), view);
  std::vector<std::int64_t> shape;
  for (int d = 0; d < static_cast<int>(View::rank); ++d)
    shape.push_back(static_cast<std::int64_t>(view.extent(d)));
  write_npy<value_type>(path, host.data(), shape);
}

}  // namespace ctxpar::cli
