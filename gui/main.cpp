// dlplan-gui: the what-if explorer. Flags as the CLI's plan command; with
// --screenshot FILE it renders the window offscreen after the first
// recompute (and sweep), saves it and exits.
//
// The flags are read, and --help, --version and bad flags answered, before
// the GUI starts (a QCoreApplication needs no display): only then is the
// QApplication made, which needs one (or QT_QPA_PLATFORM=offscreen).
// Exit codes as dlplan's: 0, 1 a user's error, 2 a usage error.
#include "main_window.hpp"

#include "dlplan/error.hpp"
#include "dlplan/request.hpp"
#include "dlplan/training.hpp"

#include <QApplication>
#include <QCommandLineParser>
#include <QTimer>

#include <cstdio>
#include <cstring>
#include <exception>
#include <tuple>

using namespace dlplan;
using namespace dlplan::gui;

namespace {

constexpr int kUsageError = 2;

void describe(QCommandLineParser& p) {
  p.setApplicationDescription(QStringLiteral(
      "dlplan what-if explorer: memory, step time and strategy per GPU count.\n"
      "The flags are dlplan plan's (see `dlplan plan --help`); without a display, run with QT_QPA_PLATFORM=offscreen."));
  p.addHelpOption();
  p.addVersionOption();
  auto opt = [&](const char* name, const char* help, const char* value) {
    p.addOption(QCommandLineOption(QString::fromLatin1(name), QString::fromLatin1(help), QString::fromLatin1(value)));
  };
  opt("model", "A zoo name (dlplan models), an IR JSON, ONNX or Hugging Face config.json file", "M");
  opt("gpus", "Data-parallel ranks in all (default 1, or the --cluster file's; 8 without any flag)", "N");
  opt("nodes", "Nodes the GPUs are split across (default 1, or the --cluster file's)", "K");
  opt("gpu", "GPU kind from the catalog (dlplan gpus), default h100-80g", "KIND");
  opt("cluster", "A cluster description JSON (instead of --gpu); its topology is kept", "FILE");
  opt("micro-batch", "Samples per GPU per micro-batch (default 1)", "B");
  opt("global-batch", "Samples per step in all (sets the accumulation)", "B");
  opt("grad-accum", "Micro-batches accumulated per step (default 1)", "A");
  opt("seq-len", "Tokens per sample (default: the model's context)", "T");
  opt("precision", "fp32, bf16-mixed or fp16-mixed (loss-scaled, as GradScaler); default: bf16-mixed where the device has bf16, else fp16-mixed, fp32 on the cpu device", "P");
  opt("optimizer", "adamw, sgd or sgd-momentum", "O");
  opt("lr", "Peak learning rate written into a saved plan (default 3e-4)", "LR");
  opt("checkpointing", "none or units", "C");
  opt("attention", "math or flash", "A");
  opt("fusion", "An imported file (ONNX, Hugging Face config.json): engine (fused, default) or eager (PyTorch's eager ops)", "F");
  opt("syncbn", "auto, on or off", "S");
  opt("strategy", "Force one strategy: ddp, zero1, zero2, zero3, hsdp2, hsdp3", "S");
  opt("bucket-mb", "DDP / ZeRO-1 gradient bucket size, MiB (default 25)", "MB");
  opt("prefetch", "ZeRO-3 units gathered ahead (default 1)", "U");
  opt("shard-group", "hsdp2 / hsdp3: ranks per shard group, contiguous (default: one node)", "G");
  opt("offload", "CPU offload: none, optimizer or params (zero3, hsdp3)", "O");
  opt("freeze", "Freeze parameters: comma-separated globs over node or unit names", "GLOBS");
  opt("lora", "LoRA adapters of this rank; the base model is frozen", "R");
  opt("lora-targets", "With --lora: globs over linear nodes, and q, k, v, o (default q,v)", "LIST");
  opt("lora-alpha", "With --lora: the adapters' scale is alpha / r (default alpha = r)", "A");
  opt("screenshot", "Render the window after the first recompute to this PNG and exit", "FILE");
  opt("size", "Window size for --screenshot, WxH (default 1680x1050)", "WxH");
}

// Flags -> Inputs, as `dlplan plan` reads them; the values are then checked
// by the planner's request builder (Engine::request), as the CLI's are.
Inputs parse(const QCommandLineParser& p) {
  Inputs in;
  auto str = [&](const char* name) { return p.value(QString::fromLatin1(name)).toStdString(); };
  auto num = [&](const char* name) -> int64_t {
    bool ok = false;
    const int64_t v = p.value(QString::fromLatin1(name)).toLongLong(&ok);
    if (!ok) throw UsageError(std::string("--") + name + ": not an integer: " + str(name));
    return v;
  };
  auto real = [&](const char* name) -> double {
    bool ok = false;
    const double v = p.value(QString::fromLatin1(name)).toDouble(&ok);
    if (!ok) throw UsageError(std::string("--") + name + ": not a number: " + str(name));
    return v;
  };
  if (p.isSet("model")) in.model = str("model");
  if (p.isSet("gpu")) in.gpu = str("gpu");
  if (p.isSet("cluster")) {
    in.cluster_file = str("cluster");
    if (auto shape = cluster_file_topology(in.cluster_file)) std::tie(in.nodes, in.gpus_per_node) = *shape;
  }
  const bool anyShape = p.isSet("gpus") || p.isSet("nodes") || (p.isSet("model") && in.cluster_file.empty());
  const int64_t gpus = p.isSet("gpus") ? num("gpus") : (anyShape ? 1 : in.world());
  const int64_t nodes = p.isSet("nodes") ? num("nodes") : (p.isSet("gpus") || in.cluster_file.empty() ? 1 : in.nodes);
  if (gpus <= 0 || nodes <= 0) throw UsageError("--gpus and --nodes must be positive");
  if (gpus % nodes != 0)
    throw UsageError("--gpus " + std::to_string(gpus) + " cannot be split evenly across --nodes " + std::to_string(nodes));
  in.nodes = static_cast<int>(nodes);
  in.gpus_per_node = static_cast<int>(gpus / nodes);
  if (p.isSet("micro-batch")) in.micro_batch = num("micro-batch");
  if (p.isSet("global-batch")) {
    in.use_global_batch = true;
    in.global_batch = num("global-batch");
  }
  if (p.isSet("grad-accum")) in.grad_accum = num("grad-accum");
  if (p.isSet("seq-len")) in.seq_len = num("seq-len");
  if (p.isSet("precision")) in.precision = str("precision");
  if (p.isSet("optimizer")) in.optimizer = str("optimizer");
  if (p.isSet("lr")) in.lr = real("lr");
  if (p.isSet("checkpointing")) in.checkpointing = str("checkpointing");
  if (p.isSet("attention")) in.attention = str("attention");
  if (p.isSet("fusion")) {
    in.fusion = str("fusion");
    parse_fusion(in.fusion, in.model);  // refused as `dlplan plan` refuses it: a bad value, a zoo model
  }
  if (p.isSet("syncbn")) in.syncbn = str("syncbn");
  if (p.isSet("bucket-mb")) in.bucket_mb = real("bucket-mb");
  if (p.isSet("prefetch")) in.prefetch = static_cast<int>(num("prefetch"));
  if (p.isSet("shard-group")) in.shard_group = static_cast<int>(num("shard-group"));
  if (p.isSet("offload")) in.offload = str("offload");
  if (p.isSet("freeze")) in.freeze = str("freeze");
  if (p.isSet("lora")) {
    in.lora = num("lora");
    if (in.lora <= 0) throw UsageError("--lora must be a positive integer (the adapters' rank)");
  }
  if (p.isSet("lora-targets")) in.lora_targets = str("lora-targets");
  if (p.isSet("lora-alpha")) in.lora_alpha = real("lora-alpha");
  if (p.isSet("strategy")) {
    try {
      in.forced = parse_strategy(str("strategy"));
    } catch (const Error& e) {
      throw UsageError(std::string("--strategy: ") + e.what());
    }
  }
  return in;
}

struct Startup {
  Inputs inputs;
  QString screenshot;
  int width = 1680, height = 1050;
};

// Reads the flags without a display. Returns an exit code when the program
// is done (help, version, a bad flag), or -1 to start the GUI.
int read_flags(int argc, char** argv, Startup& s) {
  QCoreApplication core(argc, argv);
  QCoreApplication::setApplicationName(QStringLiteral("dlplan-gui"));
  QCoreApplication::setApplicationVersion(QStringLiteral(DLPLAN_VERSION));
  QCommandLineParser p;
  describe(p);
  if (!p.parse(QCoreApplication::arguments())) {
    std::fprintf(stderr, "dlplan-gui: error: %s (see dlplan-gui --help)\n", qPrintable(p.errorText()));
    return kUsageError;
  }
  if (p.isSet(QStringLiteral("help"))) {
    std::fputs(qPrintable(p.helpText()), stdout);
    return 0;
  }
  if (p.isSet(QStringLiteral("version"))) {
    std::printf("dlplan-gui %s\n", DLPLAN_VERSION);
    return 0;
  }
  if (!p.positionalArguments().isEmpty()) {
    std::fprintf(stderr, "dlplan-gui: error: unexpected argument '%s' (see dlplan-gui --help)\n",
                 qPrintable(p.positionalArguments().front()));
    return kUsageError;
  }
  try {
    s.inputs = parse(p);
    // The request builder checks every value now, as `dlplan plan` would.
    Engine().request(s.inputs);
  } catch (const UsageError& e) {
    std::fprintf(stderr, "dlplan-gui: error: %s\n", e.what());
    return kUsageError;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dlplan-gui: error: %s\n", e.what());
    return 1;
  }
  s.screenshot = p.value(QStringLiteral("screenshot"));
  if (p.isSet(QStringLiteral("size"))) {
    const QStringList wh = p.value(QStringLiteral("size")).split(QLatin1Char('x'));
    bool okw = false, okh = false;
    if (wh.size() == 2) s.width = wh[0].toInt(&okw), s.height = wh[1].toInt(&okh);
    if (!okw || !okh || s.width <= 0 || s.height <= 0) {
      std::fprintf(stderr, "dlplan-gui: error: --size must be WxH, e.g. 1680x1050\n");
      return kUsageError;
    }
  }
  return -1;
}

}  // namespace

int main(int argc, char** argv) {
  Startup s;
  if (int done = read_flags(argc, argv, s); done >= 0) return done;
  // A screenshot needs no display.
  if (!s.screenshot.isEmpty() && qEnvironmentVariableIsEmpty("QT_QPA_PLATFORM") &&
      qEnvironmentVariableIsEmpty("DISPLAY") && qEnvironmentVariableIsEmpty("WAYLAND_DISPLAY"))
    qputenv("QT_QPA_PLATFORM", "offscreen");
  QApplication app(argc, argv);
  QApplication::setApplicationName(QStringLiteral("dlplan-gui"));
  QApplication::setApplicationVersion(QStringLiteral(DLPLAN_VERSION));

  MainWindow w;
  const QString shot = s.screenshot;
  if (!shot.isEmpty()) {
    w.setInteractiveErrors(false);
    QObject::connect(&w, &MainWindow::errorShown, &app, [&](const QString& text) {
      std::fprintf(stderr, "dlplan-gui: error: %s\n", qPrintable(text));
      QApplication::exit(1);
    });
    QObject::connect(&w, &MainWindow::sweepShown, &app, [&](quint64 gen) {
      if (gen != w.recomputer().generation()) return;
      QTimer::singleShot(100, &app, [&] {
        const bool ok = w.grab().save(shot);
        if (!ok) std::fprintf(stderr, "dlplan-gui: error: cannot write %s\n", qPrintable(shot));
        else std::fprintf(stderr, "wrote %s\n", qPrintable(shot));
        QApplication::exit(ok ? 0 : 1);
      });
    });
    QTimer::singleShot(120000, &app, [] {
      std::fprintf(stderr, "dlplan-gui: error: no result within 120 s\n");
      QApplication::exit(1);
    });
    w.resize(s.width, s.height);
  } else {
    w.resize(1500, 950);
  }
  w.setInputs(s.inputs);
  w.show();
  return QApplication::exec();
}
