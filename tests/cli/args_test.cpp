// The CLI's option parser and subcommand registry (examples/cli/command.hpp): every accepted
// spelling, and a clear UsageError for each kind of bad command line. Local code: run at np 1.
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "choice.hpp"
#include "command.hpp"
#include "ctxpar_test/harness.hpp"

namespace {

using ctxpar::cli::Args;

// True when `f` throws a UsageError whose message contains every string of `needles`.
template <class F>
bool usage_error(F&& f, const std::vector<std::string>& needles) {
  try {
    f();
  } catch (const ctxpar::cli::UsageError& e) {
    const std::string text = e.what();
    for (const auto& n : needles) {
      if (text.find(n) == std::string::npos) {
        BOOST_TEST_MESSAGE("message '" << text << "' lacks '" << n << "'");
        return false;
      }
    }
    return true;
  } catch (...) {
    return false;
  }
  return false;
}

int ran_with = -1;
int fake_command(const Args& args, const ctxpar::Group&) {
  ran_with = args.get<int>("n");
  return 7;
}
bool fake_part(const ctxpar::Group&, std::ostream& report) {
  report << "fake";
  return true;
}

}  // namespace

CTXPAR_CLI_COMMAND("zz-test", "a command registered by the test", "--n N [--verbose]",
                   fake_command);
CTXPAR_CLI_DEMO_PART("zz-test-part", fake_part);
// This executable is not the tool: it registers its own `demo` to test the demo-option hook.
CTXPAR_CLI_COMMAND("demo", "the test's demo", "[--length N]", fake_command);
CTXPAR_CLI_DEMO_OPTIONS("[--zz-seq-len N] [--zz-zigzag]");

BOOST_AUTO_TEST_CASE(values_flags_and_spellings) {
  const Args a("t", {"--n", "12", "--x=2.5", "--flag", "--shift", "-3", "--name", "abc", "--big",
                     "9000000000", "--yes", "true", "--empty="});
  BOOST_TEST(a.get<int>("n") == 12);
  BOOST_TEST(a.get<double>("x") == 2.5);
  BOOST_TEST(a.get<float>("x") == 2.5f);
  BOOST_TEST(a.has("flag"));
  BOOST_TEST(!a.has("other"));
  BOOST_TEST(a.get<int>("shift") == -3);
  BOOST_TEST(a.get<std::string>("name") == "abc");
  BOOST_TEST(a.get<std::int64_t>("big") == 9000000000LL);
  BOOST_TEST(a.get<bool>("yes"));
  // An empty value is a value left out by mistake, refused by name (never taken as absent).
  BOOST_TEST(usage_error([&] { a.get<std::string>("empty"); }, {"--empty has an empty value"}));
  BOOST_TEST(usage_error([&] { a.get<std::string>("empty", "x"); }, {"--empty"}));
  BOOST_TEST(a.get<int>("absent", 5) == 5);
  BOOST_TEST(a.get("absent", "text") == "text");
  BOOST_TEST(a.given("flag"));
}

BOOST_AUTO_TEST_CASE(missing_and_ill_typed_options) {
  const Args a("swa", {"--n", "12abc", "--x", "nan-ish", "--flag", "--k", "99999999999", "--u",
                       "-1", "--b", "maybe", "--v", "3"});
  BOOST_TEST(usage_error([&] { a.get<int>("length"); },
                         {"ctxpar swa", "missing required option --length"}));
  BOOST_TEST(usage_error([&] { a.get<int>("n"); }, {"--n must be an integer", "12abc"}));
  BOOST_TEST(usage_error([&] { a.get<int>("n", 3); }, {"--n must be an integer"}));
  BOOST_TEST(usage_error([&] { a.get<double>("x"); }, {"--x must be a finite number", "nan-ish"}));
  BOOST_TEST(usage_error([&] { a.get<int>("k"); }, {"--k is out of range", "99999999999"}));
  BOOST_TEST(usage_error([&] { a.get<unsigned>("u"); }, {"--u is out of range"}));
  BOOST_TEST(usage_error([&] { a.get<bool>("b"); }, {"--b must be a boolean", "maybe"}));
  BOOST_TEST(usage_error([&] { a.get<int>("flag"); }, {"--flag needs a value"}));
  BOOST_TEST(usage_error([&] { a.has("v"); }, {"--v is a flag and takes no value"}));
}

BOOST_AUTO_TEST_CASE(non_finite_and_out_of_range_values_name_the_option) {
  const Args a("chunkwise", {"--scale", "nan", "--s2", "inf", "--s3", "-inf", "--s4", "1e999",
                             "--f", "1e300", "--chunk", "0", "--rank", "3", "--ok", "2.5"});
  for (const char* key : {"scale", "s2", "s3", "s4"}) {
    BOOST_TEST(
        usage_error([&] { a.get<double>(key); },
                    {"ctxpar chunkwise", "--" + std::string(key) + " must be a finite number"}));
  }
  // Finite as a double, infinite as a float.
  BOOST_TEST(usage_error([&] { a.get<float>("f"); }, {"--f must be a finite number"}));
  BOOST_TEST(a.get<double>("f") == 1e300);
  BOOST_TEST(a.get<double>("ok") == 2.5);
  // A subnormal (strtod's ERANGE for underflow) is finite and accepted.
  const Args tiny("hybrid", {"--lr", "1e-320"});
  BOOST_TEST(tiny.get<double>("lr") > 0.0);
  BOOST_TEST(tiny.get<double>("lr") < 1e-300);
  BOOST_TEST(usage_error([&] { a.get_in<int>("chunk", 64, 1, 4096); },
                         {"--chunk: out of range", "[1, 4096]", "got 0"}));
  BOOST_TEST(a.get_in<int>("absent", 64, 1, 4096) == 64);
  BOOST_TEST(
      usage_error([&] { a.get_in<int>("rank", -1, -1, 1, "names a rank that does not exist"); },
                  {"--rank: names a rank that does not exist", "[-1, 1]", "got 3"}));
  BOOST_TEST(usage_error([&] { a.require("ok", false, "must be even", "even", 2.5); },
                         {"--ok: must be even", "got 2.5"}));
}

BOOST_AUTO_TEST_CASE(unknown_repeated_and_positional_arguments) {
  const std::set<std::string> allowed{"n", "verbose"};
  BOOST_TEST(usage_error(
      [&] {
        Args("swa", {"--n", "1", "--bogus", "2"}, allowed);
      },
      {"unknown option --bogus", "--n, --verbose"}));
  BOOST_TEST(usage_error([&] { Args("swa", {"--n", "1", "--n", "2"}, allowed); }, {"given twice"}));
  BOOST_TEST(usage_error([&] { Args("swa", {"input.npy"}, allowed); }, {"input.npy"}));
  BOOST_TEST(usage_error([&] { Args("swa", {"-n", "3"}, allowed); }, {"-n"}));
}

BOOST_AUTO_TEST_CASE(usage_strings_declare_the_options) {
  const auto opts = ctxpar::cli::options_in_usage("--q FILE [--seq-len N] [--zigzag] --out_dir D");
  BOOST_TEST((opts == std::set<std::string>{"q", "seq-len", "zigzag", "out_dir"}));
}

BOOST_AUTO_TEST_CASE(registry_dispatch_and_help) {
  const auto& group = ctxpar::test::world();
  std::ostringstream help;
  ctxpar::cli::print_help(help);
  BOOST_TEST(help.str().find("zz-test") != std::string::npos);
  BOOST_TEST(help.str().find("a command registered by the test") != std::string::npos);

  auto inv = ctxpar::cli::parse_invocation({"zz-test", "--n", "4", "--verbose"});
  BOOST_TEST(!inv.help);
  BOOST_TEST(inv.command->fn(*inv.args, group) == 7);
  BOOST_TEST(ran_with == 4);
  BOOST_TEST(ctxpar::cli::parse_invocation({"zz-test", "--help"}).help);
  BOOST_TEST(ctxpar::cli::parse_invocation({}).help);
  BOOST_TEST(ctxpar::cli::parse_invocation({"help", "zz-test"}).command != nullptr);
  BOOST_TEST(
      usage_error([] { ctxpar::cli::parse_invocation({"nope"}); }, {"unknown command", "nope"}));
  BOOST_TEST(usage_error(
      [] {
        ctxpar::cli::parse_invocation({"zz-test", "--m", "1"});
      },
      {"ctxpar zz-test", "unknown option --m"}));

  bool found = false;
  for (const auto& p : ctxpar::cli::demo_parts()) {
    if (p.name == "zz-test-part") {
      std::ostringstream report;
      found = p.fn(group, report) && report.str() == "fake";
    }
  }
  BOOST_TEST(found);
}

BOOST_AUTO_TEST_CASE(demo_parts_declare_options) {
  auto inv =
      ctxpar::cli::parse_invocation({"demo", "--zz-seq-len", "64", "--zz-zigzag", "--length", "3"});
  BOOST_TEST(inv.args->get<int>("zz-seq-len") == 64);
  BOOST_TEST(inv.args->has("zz-zigzag"));
  std::ostringstream usage;
  ctxpar::cli::print_usage(usage, *inv.command);
  BOOST_TEST(usage.str().find("[--length N] [--zz-seq-len N] [--zz-zigzag]") != std::string::npos);
  BOOST_TEST(usage_error(
      [] {
        ctxpar::cli::parse_invocation({"demo", "--zz-other", "1"});
      },
      {"unknown option --zz-other"}));
  // Another command does not accept the demo's options.
  BOOST_TEST(usage_error(
      [] {
        ctxpar::cli::parse_invocation({"zz-test", "--zz-zigzag"});
      },
      {"unknown option --zz-zigzag"}));
  bool threw = false;
  try {
    ctxpar::cli::demo_args();
  } catch (const ctxpar::Error&) {
    threw = true;
  }
  BOOST_TEST(threw);
}

// The option tables of choice.hpp: a spelling selects its tag, the default applies when the option
// is absent, and any other spelling is refused by the option's name with every accepted value.
BOOST_AUTO_TEST_CASE(choice_options_select_tags_by_name) {
  using ctxpar::cli::choose;
  using ctxpar::cli::layouts;
  using ctxpar::cli::swa_policies;
  const Args a("swa", {"--policy", "halo", "--layout", "bogus", "--empty="});
  const int policy = choose(a, "policy", swa_policies, "allgather");
  BOOST_TEST(policy == 2);
  BOOST_TEST(swa_policies.is<ctxpar::swa::HaloKV>(policy));
  BOOST_TEST(!swa_policies.is<ctxpar::swa::RopeBeforeGather>(policy));
  BOOST_TEST(std::string(swa_policies.name(policy)) == "halo");
  const std::string tag_name =
      swa_policies.visit(policy, [](auto tag) -> std::string { return decltype(tag)::name; });
  BOOST_TEST(tag_name == "HaloKV");
  BOOST_TEST(layouts.is<ctxpar::Zigzag>(choose(a, "absent", layouts, "zigzag")));
  BOOST_TEST(layouts.index("contiguous") == 0);
  BOOST_TEST(layouts.index("Zigzag") == -1);
  BOOST_TEST(swa_policies.list() == "allgather, rope-after or halo");
  BOOST_TEST(usage_error([&] { choose(a, "layout", layouts, "contiguous"); },
                         {"ctxpar swa", "unknown --layout", "contiguous or zigzag", "bogus"}));
  BOOST_TEST(
      usage_error([&] { choose(a, "family", layouts); }, {"missing required option --family"}));
  BOOST_TEST(usage_error([&] { choose(a, "empty", layouts, "zigzag"); }, {"--empty"}));
  bool threw = false;
  try {
    layouts.visit(layouts.size(), [](auto) {});
  } catch (const std::logic_error&) {
    threw = true;
  }
  BOOST_TEST(threw);
}
