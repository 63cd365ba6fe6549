// The strategy table against the CLI: for the same inputs, every memory
// category (bytes), the runtime and peak, and `fits` equal what `dlplan
// --format json` prints; the saved plan equals `dlplan --out`. Changing an
// input updates the table (dataChanged), the charts' models fill, and charts
// export as PNG and SVG.
#include "main_window.hpp"

#include <QComboBox>
#include <QJsonArray>
#include <QJsonDocument>
#include <QJsonObject>
#include <QProcess>
#include <QSignalSpy>
#include <QSpinBox>
#include <QTemporaryDir>
#include <QtTest>

using namespace dlplan;
using namespace dlplan::gui;

namespace {

// Waits until the window shows results for its latest request.
bool waitForResults(MainWindow& w, int ms = 60000) {
  QSignalSpy spy(&w, &MainWindow::resultsShown);
  QElapsedTimer t;
  t.start();
  while (t.elapsed() < ms) {
    if (!w.recomputer().busy() && w.hasResults() && w.recomputer().results()->inputs == w.inputs()) return true;
    spy.wait(200);
  }
  return false;
}

bool waitForSweep(MainWindow& w, int ms = 60000) {
  QElapsedTimer t;
  t.start();
  while (t.elapsed() < ms) {
    if (!w.recomputer().busy() && w.sweepModel().rowCount() > 0) return true;
    QTest::qWait(50);
  }
  return false;
}

QJsonObject runCli(const QStringList& args) {
  QProcess p;
  p.start(QStringLiteral(DLPLAN_EXE), args);
  if (!p.waitForFinished(60000) || p.exitCode() != 0) {
    qWarning() << "dlplan failed:" << args << p.readAllStandardError();
    return {};
  }
  return QJsonDocument::fromJson(p.readAllStandardOutput()).object();
}

qint64 cell(const StrategyTableModel& m, int row, int col) { return m.data(m.index(row, col), kRawRole).toLongLong(); }

}  // namespace

class TableTest : public QObject {
  Q_OBJECT

 private slots:
  void changingAnInputUpdatesTheTable();
  void tableEqualsCliJson_data();
  void tableEqualsCliJson();
  void savedPlanEqualsCliOut();
  void fusionControlFollowsTheModel();
  void chartsFillAndExport();

 private:
  MainWindow w_;
};

void TableTest::changingAnInputUpdatesTheTable() {
  w_.setInteractiveErrors(false);
  w_.recomputer().setSweepEnabled(false);  // only chartsFillAndExport needs it
  Inputs in;
  in.model = "gpt2";
  in.nodes = 1;
  in.gpus_per_node = 8;
  in.micro_batch = 2;
  w_.setInputs(in);
  QVERIFY(waitForResults(w_));
  auto& m = w_.strategyModel();
  QCOMPARE(m.rowCount(), 4);
  const qint64 before = cell(m, 0, StrategyTableModel::Activations);

  QSignalSpy changed(&m, &QAbstractItemModel::dataChanged);
  QSignalSpy reset(&m, &QAbstractItemModel::modelReset);
  // Through the control, as a user would: the batch spin box.
  QSpinBox* batch = nullptr;
  for (auto* s : w_.findChildren<QSpinBox*>())
    if (s->value() == 2 && s->maximum() == (1 << 24)) batch = s;
  QVERIFY(batch);
  batch->setValue(8);
  QCOMPARE(w_.inputs().micro_batch, 8);
  QVERIFY(waitForResults(w_));
  QVERIFY(changed.count() + reset.count() >= 1);
  const qint64 after = cell(m, 0, StrategyTableModel::Activations);
  QCOMPARE(after, before * 4);  // activations are linear in the micro-batch (control: they changed)

  // A stale request is dropped: two changes in a row deliver only the last.
  QSignalSpy shown(&w_, &MainWindow::resultsShown);
  in.micro_batch = 3;
  w_.setInputs(in);
  in.micro_batch = 5;
  w_.setInputs(in);
  QVERIFY(waitForResults(w_));
  QCOMPARE(w_.recomputer().results()->inputs.micro_batch, 5);
  for (const auto& args : shown) QCOMPARE(args.at(0).toULongLong(), w_.recomputer().generation());
}

void TableTest::tableEqualsCliJson_data() {
  QTest::addColumn<QStringList>("flags");
  QTest::newRow("gpt2 8 gpus mb4") << QStringList{"--model", "gpt2", "--gpus", "8", "--micro-batch", "4"};
  QTest::newRow("llama2-7b 2x8 a100 ckpt flash")
      << QStringList{"--model", "llama2-7b", "--gpus", "16", "--nodes", "2", "--gpu", "a100-80g",
                     "--checkpointing", "units", "--attention", "flash", "--micro-batch", "2"};
  QTest::newRow("resnet50 4 gpus syncbn on global batch")
      << QStringList{"--model", "resnet50", "--gpus", "4", "--micro-batch", "8", "--global-batch", "64", "--syncbn", "on"};
  QTest::newRow("vit-b16 fp32 sgd seq") << QStringList{"--model", "vit-b16", "--gpus", "2", "--precision", "fp32",
                                                        "--optimizer", "sgd-momentum", "--micro-batch", "16"};
  QTest::newRow("tiny-gpt cpu seq-len 32") << QStringList{"--model", "tiny-gpt", "--gpus", "2", "--gpu", "cpu", "--seq-len", "32"};
  QTest::newRow("gpt2 8 gpus lora 8 on q,v,mlp") << QStringList{"--model", "gpt2", "--gpus", "8", "--micro-batch", "4", "--lora",
                                                                 "8", "--lora-targets", "q,v,*.mlp.*", "--lora-alpha", "16"};
  QTest::newRow("gpt2 4 gpus freeze embeddings and h.0") << QStringList{"--model", "gpt2", "--gpus", "4", "--freeze", "wte,wpe,h.0.*"};
  QTest::newRow("HF tiny-gemma --fusion eager")
      << QStringList{"--model", DLPLAN_SOURCE_DIR "/tests/fixtures/hf/tiny-gemma.json", "--gpus", "4", "--fusion", "eager"};
  QTest::newRow("llama2-7b 2 gpus mb16: nothing fits") << QStringList{"--model", "llama2-7b", "--gpus", "2", "--micro-batch", "16"};
}

void TableTest::tableEqualsCliJson() {
  QFETCH(QStringList, flags);
  Inputs in;
  auto flag = [&](const char* name) {
    const int i = flags.indexOf(QString::fromLatin1(name));
    return i >= 0 ? flags.at(i + 1) : QString();
  };
  in.model = flag("--model").toStdString();
  const int gpus = flag("--gpus").toInt();
  in.nodes = flag("--nodes").isEmpty() ? 1 : flag("--nodes").toInt();
  in.gpus_per_node = gpus / in.nodes;
  if (!flag("--gpu").isEmpty()) in.gpu = flag("--gpu").toStdString();
  if (!flag("--micro-batch").isEmpty()) in.micro_batch = flag("--micro-batch").toLongLong();
  if (!flag("--global-batch").isEmpty()) in.use_global_batch = true, in.global_batch = flag("--global-batch").toLongLong();
  if (!flag("--seq-len").isEmpty()) in.seq_len = flag("--seq-len").toLongLong();
  if (!flag("--checkpointing").isEmpty()) in.checkpointing = flag("--checkpointing").toStdString();
  if (!flag("--attention").isEmpty()) in.attention = flag("--attention").toStdString();
  if (!flag("--precision").isEmpty()) in.precision = flag("--precision").toStdString();
  if (!flag("--optimizer").isEmpty()) in.optimizer = flag("--optimizer").toStdString();
  if (!flag("--syncbn").isEmpty()) in.syncbn = flag("--syncbn").toStdString();
  if (!flag("--fusion").isEmpty()) in.fusion = flag("--fusion").toStdString();
  in.freeze = flag("--freeze").toStdString();
  if (!flag("--lora").isEmpty()) in.lora = flag("--lora").toLongLong();
  in.lora_targets = flag("--lora-targets").toStdString();
  if (!flag("--lora-alpha").isEmpty()) in.lora_alpha = flag("--lora-alpha").toDouble();
  w_.setInputs(in);
  QVERIFY(waitForResults(w_));

  const QJsonObject cli = runCli(flags + QStringList{"--format", "json"});
  QVERIFY(!cli.isEmpty());
  const QJsonArray rows = cli.value("strategies").toArray();
  const auto& m = w_.strategyModel();
  QCOMPARE(m.rowCount(), rows.size());
  const char* categories[] = {"params", "grads", "optimizer", "activations", "gathered", "comm", "workspace"};
  int differing = 0;
  for (int r = 0; r < rows.size(); ++r) {
    const QJsonObject row = rows[r].toObject();
    QCOMPARE(m.data(m.index(r, StrategyTableModel::Strategy), kRawRole).toString(), row.value("strategy").toString());
    const QJsonObject mem = row.value("memory").toObject();
    for (int c = 0; c < 7; ++c) {
      // JSON numbers are doubles: exact for integers below 2^53.
      QCOMPARE(cell(m, r, StrategyTableModel::Params + c), static_cast<qint64>(mem.value(categories[c]).toDouble()));
    }
    QCOMPARE(cell(m, r, StrategyTableModel::Runtime), static_cast<qint64>(mem.value("runtime").toDouble()));
    QCOMPARE(cell(m, r, StrategyTableModel::Peak), static_cast<qint64>(mem.value("peak").toDouble()));
    QCOMPARE(m.data(m.index(r, StrategyTableModel::Fits), kRawRole).toBool(), row.value("fits").toBool());
    QVERIFY(qFuzzyCompare(m.data(m.index(r, StrategyTableModel::StepMs), kRawRole).toDouble(), row.value("step_seconds").toDouble()));
    // Control: a neighbouring row differs somewhere, so the comparison can fail.
    if (r > 0 && cell(m, r, StrategyTableModel::Peak) != cell(m, r - 1, StrategyTableModel::Peak)) ++differing;
  }
  QVERIFY(differing > 0);
  const QJsonValue rec = cli.value("recommendation").toObject().value("strategy");
  if (rec.isNull()) QCOMPARE(m.recommendedRow(), -1);
  else QCOMPARE(m.data(m.index(m.recommendedRow(), 0), kRawRole).toString(), rec.toString());
}

// The fusion control is on for a file dlplan imports and off for a zoo
// model; switched to eager through the control, a Hugging Face Gemma config
// plans its RMSNorm op by op, which keeps more activations (the control:
// the switch reached the planner).
void TableTest::fusionControlFollowsTheModel() {
  auto* fusion = w_.findChild<QComboBox*>(QStringLiteral("fusion"));
  QVERIFY(fusion);
  Inputs in;
  in.model = DLPLAN_SOURCE_DIR "/tests/fixtures/hf/tiny-gemma.json";
  in.gpus_per_node = 4;
  w_.setInputs(in);
  QVERIFY(waitForResults(w_));
  QVERIFY(fusion->isEnabled());
  QCOMPARE(fusion->currentText(), QStringLiteral("engine"));
  const qint64 engine = cell(w_.strategyModel(), 0, StrategyTableModel::Activations);
  fusion->setCurrentText(QStringLiteral("eager"));
  QCOMPARE(w_.inputs().fusion, std::string("eager"));
  QVERIFY(waitForResults(w_));
  QVERIFY(cell(w_.strategyModel(), 0, StrategyTableModel::Activations) > engine);

  in = w_.inputs();
  in.model = "gpt2";  // a zoo model: the window keeps its choice but the request carries none
  w_.setInputs(in);
  QVERIFY(waitForResults(w_));
  QVERIFY(!fusion->isEnabled());
  QVERIFY(w_.hasResults());
}

void TableTest::savedPlanEqualsCliOut() {
  Inputs in;
  in.model = "vit-b16";
  in.nodes = 1;
  in.gpus_per_node = 8;
  in.micro_batch = 32;
  w_.setInputs(in);
  QVERIFY(waitForResults(w_));
  QTemporaryDir dir;
  const QString gui = dir.filePath("gui.json"), cli = dir.filePath("cli.json");
  QVERIFY(w_.savePlan(gui));
  QProcess p;
  p.start(QStringLiteral(DLPLAN_EXE), {"--model", "vit-b16", "--gpus", "8", "--micro-batch", "32", "--out", cli});
  QVERIFY(p.waitForFinished(60000));
  QCOMPARE(p.exitCode(), 0);
  QFile a(gui), b(cli);
  QVERIFY(a.open(QIODevice::ReadOnly) && b.open(QIODevice::ReadOnly));
  const QByteArray ga = a.readAll(), cb = b.readAll();
  QVERIFY(ga.size() > 1000);
  QCOMPARE(ga, cb);
  // Control: another strategy's plan differs.
  w_.selectStrategyRow((w_.selectedRow() + 3) % 4);
  QVERIFY(w_.savePlan(gui));
  QFile c(gui);
  QVERIFY(c.open(QIODevice::ReadOnly));
  QVERIFY(c.readAll() != cb);
}

void TableTest::chartsFillAndExport() {
  Inputs in;
  in.model = "gpt2";
  in.nodes = 2;
  in.gpus_per_node = 8;
  in.micro_batch = 4;
  w_.recomputer().setSweepEnabled(true);
  w_.setInputs(in);
  QVERIFY(waitForResults(w_));
  QVERIFY(waitForSweep(w_));
  w_.resize(1500, 950);
  w_.show();
  QVERIFY(w_.timelineModel().rowCount() > 10);
  QVERIFY(w_.gantt()->simulation() != nullptr);
  QVERIFY(!w_.gantt()->simulation()->compute.empty());
  QVERIFY(!w_.gantt()->simulation()->comm.empty());
  QVERIFY(w_.tensorModel().rowCount() > 0);
  QCOMPARE(w_.sweepModel().rowCount(), 11);
  // The timeline's peak is the table's peak for the selected strategy.
  qint64 top = 0;
  const int last = TimelineModel::FirstCumulative + kCategories - 1;
  for (int r = 0; r < w_.timelineModel().rowCount(); ++r)
    top = std::max(top, w_.timelineModel().data(w_.timelineModel().index(r, last), kRawRole).toLongLong());
  QCOMPARE(top, cell(w_.strategyModel(), w_.selectedRow(), StrategyTableModel::Peak));
  QVERIFY(!w_.recommendationText().isEmpty());

  QTemporaryDir dir;
  for (const QString& name : w_.chartNames()) {
    for (const char* ext : {".png", ".svg"}) {
      const QString path = dir.filePath(name + QString::fromLatin1(ext));
      QVERIFY2(w_.exportChart(name, path), qPrintable(path));
      QVERIFY(QFileInfo(path).size() > 500);
    }
  }
  QImage img(dir.filePath("memory.png"));
  QVERIFY(!img.isNull());
  QFile svg(dir.filePath("memory.svg"));
  QVERIFY(svg.open(QIODevice::ReadOnly));
  QVERIFY(svg.readAll().contains("<svg"));
}

QTEST_MAIN(TableTest)
#include "table_test.moc"
