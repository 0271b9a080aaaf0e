// The CLI's .npy reader and writer (examples/cli/npy.hpp): round trips of every supported dtype and
// shape, the on-disk layout NumPy expects, and a clear error for every unsupported or damaged file.
// Local file I/O: run at np 1.
#include <Kokkos_Core.hpp>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <type_traits>
#include <vector>

#include "ctxpar_test/harness.hpp"
#include "npy.hpp"

namespace {

using ctxpar::cli::NpyArray;

std::string temp_path(const std::string& name) {
  return "ctxpar-npy-test-" + std::to_string(ctxpar::test::world().rank()) + "-" + name + ".npy";
}

std::vector<char> file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<char>((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

void write_bytes(const std::string& path, const std::vector<char>& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// A file written by hand the way NumPy writes it, for a given header dictionary and data size.
void write_raw(const std::string& path, const std::string& dict, std::size_t data_bytes,
               int major = 1) {
  std::string header = dict;
  const std::size_t prefix = major == 1 ? 10 : 12;
  header.append((64 - (prefix + header.size() + 1) % 64) % 64, ' ');
  header += '\n';
  std::vector<char> bytes = {'\x93', 'N', 'U', 'M', 'P', 'Y', static_cast<char>(major), 0};
  for (std::size_t i = 0; i < prefix - 8; ++i)
    bytes.push_back(static_cast<char>((header.size() >> (8 * i)) & 0xff));
  bytes.insert(bytes.end(), header.begin(), header.end());
  for (std::size_t i = 0; i < data_bytes; ++i) bytes.push_back(static_cast<char>(i));
  write_bytes(path, bytes);
}

template <class F>
bool read_error(F&& f, const std::vector<std::string>& needles) {
  try {
    f();
  } catch (const ctxpar::Error& e) {
    const std::string text = e.what();
    for (const auto& n : needles) {
      if (text.find(n) == std::string::npos) {
        BOOST_TEST_MESSAGE("message '" << text << "' lacks '" << n << "'");
        return false;
      }
    }
    return true;
  }
  return false;
}

template <class T>
bool round_trip(const std::vector<std::int64_t>& shape) {
  std::int64_t n = 1;
  for (auto e : shape) n *= e;
  std::vector<T> values;
  for (std::int64_t i = 0; i < n; ++i) {
    const double x = ctxpar::test::uniform(11, static_cast<std::uint64_t>(i)) * 1000;
    if constexpr (std::is_integral_v<T>)
      values.push_back(static_cast<T>(x));
    else
      values.push_back(ctxpar::narrow<T>(x));
  }
  const std::string path = temp_path("round-trip");
  ctxpar::cli::write_npy(path, values.data(), shape);
  const std::vector<char> raw = file_bytes(path);
  const NpyArray back = ctxpar::cli::read_npy(path);
  std::remove(path.c_str());
  // NumPy's layout: the data starts at a multiple of 64 bytes, right after the '\n'-terminated
  // header.
  const std::size_t data_begin = raw.size() - static_cast<std::size_t>(n) * sizeof(T);
  bool ok = data_begin % 64 == 0 && raw[data_begin - 1] == '\n';
  ok =
      ok && back.dtype() == ctxpar::cli::dtype_of<T>() && back.shape() == shape && back.size() == n;
  const std::vector<T> read = back.values<T>();
  ok = ok && read.size() == values.size() &&
       (values.empty() || std::memcmp(read.data(), values.data(), n * sizeof(T)) == 0);
  return ok;
}

}  // namespace

BOOST_AUTO_TEST_CASE(round_trips_every_dtype_and_shape) {
  const std::vector<std::vector<std::int64_t>> shapes = {{},        {1},    {5},
                                                         {2, 3, 4}, {0, 3}, {3, 1, 2, 2}};
  for (const auto& shape : shapes) {
    BOOST_TEST(round_trip<float>(shape), "float32 " << NpyArray::shape_text(shape));
    BOOST_TEST(round_trip<double>(shape), "float64 " << NpyArray::shape_text(shape));
    BOOST_TEST(round_trip<std::int32_t>(shape), "int32 " << NpyArray::shape_text(shape));
    BOOST_TEST(round_trip<ctxpar::float16>(shape), "float16 " << NpyArray::shape_text(shape));
    BOOST_TEST(round_trip<ctxpar::bfloat16>(shape), "bfloat16 " << NpyArray::shape_text(shape));
  }
}

BOOST_AUTO_TEST_CASE(header_text_matches_numpy) {
  const std::string path = temp_path("header");
  const std::vector<float> values = {1, 2, 3, 4, 5, 6};
  ctxpar::cli::write_npy(path, values.data(), {2, 3});
  const std::vector<char> raw = file_bytes(path);
  std::remove(path.c_str());
  const std::string text(raw.begin(), raw.end());
  BOOST_TEST(text.find("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }") == 10u);
  BOOST_TEST(raw[6] == 1);
  BOOST_TEST(NpyArray::shape_text({5}) == "(5,)");
  BOOST_TEST(NpyArray::shape_text({}) == "()");
}

BOOST_AUTO_TEST_CASE(reads_version_2_headers) {
  const std::string path = temp_path("v2");
  write_raw(path, "{'descr': '<i4', 'fortran_order': False, 'shape': (3,), }", 12, 2);
  const NpyArray a = ctxpar::cli::read_npy(path);
  std::remove(path.c_str());
  BOOST_TEST((a.shape() == std::vector<std::int64_t>{3}));
  BOOST_TEST((a.dtype() == ctxpar::cli::Dtype::int32));
  BOOST_TEST(a.values<std::int32_t>()[0] == 0x03020100);
}

BOOST_AUTO_TEST_CASE(truncated_files_are_errors) {
  const std::string path = temp_path("truncated");
  const std::vector<double> values(10, 1.5);
  ctxpar::cli::write_npy(path, values.data(), {2, 5});
  std::vector<char> raw = file_bytes(path);
  write_bytes(path, std::vector<char>(raw.begin(), raw.end() - 3));
  BOOST_TEST(read_error([&] { ctxpar::cli::read_npy(path); },
                        {"truncated data", "80 data bytes", "77 data bytes"}));
  write_bytes(path, std::vector<char>(raw.begin(), raw.begin() + 40));
  BOOST_TEST(read_error([&] { ctxpar::cli::read_npy(path); }, {"truncated header"}));
  write_bytes(path, std::vector<char>(raw.begin(), raw.begin() + 5));
  BOOST_TEST(read_error([&] { ctxpar::cli::read_npy(path); }, {"bad magic"}));
  std::remove(path.c_str());
  BOOST_TEST(read_error([&] { ctxpar::cli::read_npy(path); }, {"cannot open"}));
}

BOOST_AUTO_TEST_CASE(unsupported_dtypes_orders_and_versions_are_errors) {
  const std::string path = temp_path("unsupported");
  write_raw(path, "{'descr': '<i8', 'fortran_order': False, 'shape': (2,), }", 16);
  BOOST_TEST(read_error([&] { ctxpar::cli::read_npy(path); }, {"unsupported dtype", "'<i8'"}));
  write_raw(path, "{'descr': '>f4', 'fortran_order': False, 'shape': (2,), }", 8);
  BOOST_TEST(read_error([&] { ctxpar::cli::read_npy(path); }, {"unsupported dtype", "'>f4'"}));
  write_raw(path, "{'descr': '<f4', 'fortran_order': True, 'shape': (2, 2), }", 16);
  BOOST_TEST(read_error([&] { ctxpar::cli::read_npy(path); }, {"C-order", "True"}));
  write_raw(path, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 2), }", 16, 3);
  BOOST_TEST(read_error([&] { ctxpar::cli::read_npy(path); }, {"format version", "3.0"}));
  write_raw(path, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, -2), }", 16);
  BOOST_TEST(read_error([&] { ctxpar::cli::read_npy(path); }, {"malformed shape"}));
  write_raw(path, "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }", 12);
  BOOST_TEST(read_error([&] { ctxpar::cli::read_npy(path); }, {"trailing bytes"}));
  std::remove(path.c_str());
}

BOOST_AUTO_TEST_CASE(hostile_headers_directories_and_empty_files_name_the_file) {
  const std::string path = temp_path("hostile");
  // 2^32 · 2^32 · 2^32 elements wrap a 64-bit count to 0, which would match an empty data part.
  write_raw(path,
            "{'descr': '<f4', 'fortran_order': False, 'shape': (4294967296, 4294967296, "
            "4294967296), }",
            0);
  BOOST_TEST(read_error([&] { ctxpar::cli::read_npy(path); },
                        {path, "byte count overflows", "(4294967296, 4294967296, 4294967296)"}));
  // Large but representable: compared with the file's size, not allocated.
  write_raw(path, "{'descr': '<f8', 'fortran_order': False, 'shape': (1000000000, 1000000), }", 8);
  BOOST_TEST(read_error([&] { ctxpar::cli::read_npy(path); }, {path, "truncated data"}));
  // A zero extent makes the count zero whatever the others are.
  write_raw(path, "{'descr': '<f4', 'fortran_order': False, 'shape': (0, 4294967296), }", 0);
  BOOST_TEST(ctxpar::cli::read_npy(path).size() == 0);
  write_bytes(path, {});
  BOOST_TEST(read_error([&] { ctxpar::cli::read_npy(path); }, {path, "empty file"}));
  std::remove(path.c_str());
  const std::string dir = temp_path("a-directory");
  BOOST_TEST(std::system(("mkdir -p " + dir).c_str()) == 0);
  BOOST_TEST(read_error([&] { ctxpar::cli::read_npy(dir); }, {dir, "is a directory"}));
  std::remove(dir.c_str());
}

BOOST_AUTO_TEST_CASE(typed_access_checks_the_dtype_and_shape) {
  const NpyArray a = NpyArray::from_values<float>({2, 2}, {1, 2, 3, 4});
  BOOST_TEST(read_error([&] { a.values<double>("--q"); },
                        {"--q has the wrong dtype", "expected <f8", "got <f4"}));
  BOOST_TEST(read_error([&] { a.data<std::int32_t>(); }, {"wrong dtype"}));
  BOOST_TEST(read_error([&] { a.require_shape({4}, "--q"); },
                        {"--q has the wrong shape", "(4,)", "(2, 2)"}));
  BOOST_TEST(a.data<float>()[3] == 4.0f);
  BOOST_TEST(read_error([&] { NpyArray::from_values<float>({3}, {1, 2}); }, {"number of values"}));
}

BOOST_AUTO_TEST_CASE(views_round_trip) {
  using View3 =
      Kokkos::View<double***, Kokkos::LayoutRight, Kokkos::DefaultExecutionSpace::memory_space>;
  View3 v("v", 3, 2, 4);
  auto h = Kokkos::create_mirror_view(v);
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 2; ++j)
      for (int k = 0; k < 4; ++k) h(i, j, k) = 100 * i + 10 * j + k;
  Kokkos::deep_copy(v, h);
  const std::string path = temp_path("view");
  ctxpar::cli::write_view(path, v);
  const NpyArray a = ctxpar::cli::read_npy(path);
  BOOST_TEST((a.shape() == std::vector<std::int64_t>{3, 2, 4}));
  BOOST_TEST(a.values<double>()[1 * 8 + 1 * 4 + 3] == 113.0);  // C order
  const View3 back = ctxpar::cli::read_view<View3>(path, "back");
  auto hb = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), back);
  bool same = back.extent(0) == 3 && back.extent(1) == 2 && back.extent(2) == 4;
  for (int i = 0; same && i < 3; ++i)
    for (int j = 0; j < 2; ++j)
      for (int k = 0; k < 4; ++k) same = same && hb(i, j, k) == h(i, j, k);
  BOOST_TEST(same);
  using View2f = Kokkos::View<float**, Kokkos::LayoutRight>;
  BOOST_TEST(read_error([&] { ctxpar::cli::read_view<View2f>(path, "x"); }, {"wrong dtype"}));
  using View2d = Kokkos::View<double**, Kokkos::LayoutRight>;
  BOOST_TEST(read_error([&] { ctxpar::cli::read_view<View2d>(path, "x"); },
                        {"number of dimensions", "expected 2", "got 3"}));
  std::remove(path.c_str());
}
