// dlplan-gui: the what-if explorer. Flags as the CLI's plan command; with
// --screenshot FILE it renders the window offscreen after the first
// recompute (and sweep), saves it and exits.
#include "main_window.hpp"

#include "dlplan/error.hpp"
#include "dlplan/training.hpp"

#include <QApplication>
#include <QCommandLineParser>
#include <QTimer>

#include <cstdio>
#include <cstring>
#include <exception>

using namespace dlplan;
using namespace dlplan::gui;

namespace {

// Flags -> Inputs, as `dlplan plan` reads them (cli/plan_command.cpp).
Inputs parse(const QCommandLineParser& p) {
  Inputs in;
  auto str = [&](const char* name) { return p.value(QString::fromLatin1(name)).toStdString(); };
  auto num = [&](const char* name) -> int64_t {
    bool ok = false;
    const int64_t v = p.value(QString::fromLatin1(name)).toLongLong(&ok);
    if (!ok) throw Error(std::string("--") + name + ": not a number: " + str(name));
    return v;
  };
  if (p.isSet("model")) in.model = str("model");
  if (p.isSet("gpu")) in.gpu = str("gpu");
  if (p.isSet("cluster")) in.cluster_file = str("cluster");
  const bool anyShape = p.isSet("gpus") || p.isSet("nodes") || p.isSet("model");
  const int64_t gpus = p.isSet("gpus") ? num("gpus") : (anyShape ? 1 : in.world());
  const int64_t nodes = p.isSet("nodes") ? num("nodes") : 1;
  if (gpus <= 0 || nodes <= 0) throw Error("--gpus and --nodes must be positive");
  if (gpus % nodes != 0) throw Error("--gpus " + std::to_string(gpus) + " cannot be split evenly across --nodes " + std::to_string(nodes));
  in.nodes = static_cast<int>(nodes);
  in.gpus_per_node = static_cast<int>(gpus / nodes);
  if (p.isSet("micro-batch")) in.micro_batch = num("micro-batch");
  if (p.isSet("global-batch")) {
    in.use_global_batch = true;
    in.global_batch = num("global-batch");
  }
  if (p.isSet("seq-len")) in.seq_len = num("seq-len");
  if (p.isSet("precision")) in.precision = str("precision");
  if (p.isSet("optimizer")) in.optimizer = str("optimizer");
  if (p.isSet("checkpointing")) in.checkpointing = str("checkpointing");
  if (p.isSet("attention")) in.attention = str("attention");
  if (p.isSet("syncbn")) in.syncbn = str("syncbn");
  if (p.isSet("strategy")) in.forced = parse_strategy(str("strategy"));
  // The names are checked here so that a typo is a message, not a silent default.
  if (!in.precision.empty()) parse_precision(in.precision);
  parse_optimizer(in.optimizer);
  parse_checkpointing(in.checkpointing);
  parse_attention(in.attention);
  parse_syncbn_mode(in.syncbn);
  return in;
}

}  // namespace

int main(int argc, char** argv) {
  // A screenshot needs no display.
  for (int i = 1; i < argc; ++i)
    if (std::strcmp(argv[i], "--screenshot") == 0 && qEnvironmentVariableIsEmpty("QT_QPA_PLATFORM") &&
        qEnvironmentVariableIsEmpty("DISPLAY") && qEnvironmentVariableIsEmpty("WAYLAND_DISPLAY"))
      qputenv("QT_QPA_PLATFORM", "offscreen");
  QApplication app(argc, argv);
  QApplication::setApplicationName(QStringLiteral("dlplan-gui"));
  QApplication::setApplicationVersion(QStringLiteral("0.1.0"));

  QCommandLineParser p;
  p.setApplicationDescription(QStringLiteral("dlplan what-if explorer: memory, step time and strategy per GPU count"));
  p.addHelpOption();
  p.addVersionOption();
  auto opt = [&](const char* name, const char* help, const char* value = "value") {
    p.addOption(QCommandLineOption(QString::fromLatin1(name), QString::fromLatin1(help), QString::fromLatin1(value)));
  };
  opt("model", "A zoo name (dlplan models), an IR JSON, ONNX or Hugging Face config.json file", "M");
  opt("gpus", "Data-parallel ranks in all (default 1; 8 without any flag)", "N");
  opt("nodes", "Nodes the GPUs are split across (default 1)", "K");
  opt("gpu", "GPU kind from the catalog (dlplan gpus), default h100-80g", "KIND");
  opt("cluster", "A cluster description JSON (instead of --gpu)", "FILE");
  opt("micro-batch", "Samples per GPU per micro-batch (default 1)", "B");
  opt("global-batch", "Samples per step in all (sets the accumulation)", "B");
  opt("seq-len", "Length of the token inputs", "T");
  opt("precision", "fp32 or bf16-mixed (default bf16-mixed; fp32 on cpu)", "P");
  opt("optimizer", "adamw, sgd or sgd-momentum", "O");
  opt("checkpointing", "none or units", "C");
  opt("attention", "math or flash", "A");
  opt("syncbn", "auto, on or off", "S");
  opt("strategy", "Force one strategy: ddp, zero1, zero2, zero3", "S");
  opt("screenshot", "Render the window after the first recompute to this PNG and exit", "FILE");
  opt("size", "Window size for --screenshot, WxH (default 1680x1050)", "WxH");
  p.process(app);

  Inputs in;
  try {
    in = parse(p);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dlplan-gui: error: %s\n", e.what());
    return 2;
  }

  MainWindow w;
  const QString shot = p.value(QStringLiteral("screenshot"));
  int width = 1680, height = 1050;
  if (p.isSet("size")) {
    const QStringList wh = p.value(QStringLiteral("size")).split(QLatin1Char('x'));
    if (wh.size() == 2) width = wh[0].toInt(), height = wh[1].toInt();
  }
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
    w.resize(width, height);
  } else {
    w.resize(1500, 950);
  }
  w.setInputs(in);
  w.show();
  return QApplication::exec();
}
