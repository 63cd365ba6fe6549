// "Run locally": tiny-cnn re-planned for the cpu device, 2 MPI ranks, 20
// steps; the chart's model fills with loss and measured peak. Cancel stops
// every rank: nothing of the job's process group, and no `dlplan train` of
// its plan, is left in /proc.
#include "main_window.hpp"

#include <QDir>
#include <QFileInfo>
#include <QSignalSpy>
#include <QtTest>

#include <cmath>

using namespace dlplan;
using namespace dlplan::gui;

namespace {

bool settle(MainWindow& w, int ms = 60000) {
  QElapsedTimer t;
  t.start();
  while (t.elapsed() < ms) {
    if (!w.recomputer().busy() && w.hasResults()) return true;
    QTest::qWait(50);
  }
  return false;
}

// Live processes whose command line mentions `needle` (zombies excluded).
QStringList processesMentioning(const QString& needle) {
  QStringList out;
  for (const QString& e : QDir("/proc").entryList(QDir::Dirs | QDir::NoDotAndDotDot)) {
    bool ok = false;
    e.toLongLong(&ok);
    if (!ok || e == QString::number(QCoreApplication::applicationPid())) continue;
    QFile cmd("/proc/" + e + "/cmdline"), stat("/proc/" + e + "/stat");
    if (!cmd.open(QIODevice::ReadOnly) || !stat.open(QIODevice::ReadOnly)) continue;
    const QByteArray s = stat.readAll();
    const int close = s.lastIndexOf(')');
    if (close > 0 && (s.mid(close + 2, 1) == "Z" || s.mid(close + 2, 1) == "X")) continue;
    const QString line = QString::fromUtf8(cmd.readAll()).replace(QChar(0), QChar(' '));
    if (line.contains(needle)) out << e + ": " + line;
  }
  return out;
}

QString mpirun() {
  const QString configured = QStringLiteral(DLPLAN_MPIRUN);
  if (!configured.isEmpty() && QFileInfo(configured).isExecutable()) return configured;
  return LocalRun::defaultMpirun();
}

}  // namespace

class LocalRunTest : public QObject {
  Q_OBJECT

 private slots:
  void init();
  void runTinyCnnOnTwoRanks();
  void cancelLeavesNoProcess();

 private:
  std::unique_ptr<MainWindow> w_;
};

void LocalRunTest::init() {
  if (mpirun().isEmpty()) QSKIP("mpirun not found (install openmpi-bin): Run locally needs it");
  if (!QFileInfo(QStringLiteral(DLPLAN_EXE)).isExecutable()) QSKIP("the dlplan executable was not built");
  w_ = std::make_unique<MainWindow>();
  w_->setInteractiveErrors(false);
  w_->recomputer().setSweepEnabled(false);
  w_->localRun().setDlplan(QStringLiteral(DLPLAN_EXE));
  w_->localRun().setMpirun(mpirun());
  Inputs in;
  in.model = "tiny-cnn";
  in.nodes = 1;
  in.gpus_per_node = 8;
  in.micro_batch = 4;
  w_->setInputs(in);
  QVERIFY(settle(*w_));
}

void LocalRunTest::runTinyCnnOnTwoRanks() {
  QSignalSpy done(w_.get(), &MainWindow::localRunFinished);
  QSignalSpy errors(w_.get(), &MainWindow::errorShown);
  QVERIFY(w_->runLocally(20));
  QVERIFY(done.wait(180000));
  QVERIFY2(errors.isEmpty(), errors.isEmpty() ? "" : qPrintable(errors.at(0).at(0).toString()));
  QVERIFY2(done.at(0).at(0).toBool(), qPrintable(done.at(0).at(1).toString()));
  const auto& m = w_->runModel();
  QCOMPARE(m.rowCount(), 20);
  QVERIFY(m.predictedPeakBytes() > 0);
  for (const auto& r : m.rows()) {
    QVERIFY(std::isfinite(r.loss) && r.loss > 0);
    QVERIFY(r.peak_bytes > 0);
  }
  QCOMPARE(m.rows().front().step, 1);
  QCOMPARE(m.rows().back().step, 20);
  // The training learns something in 20 steps (control for a flat, fake stream).
  QVERIFY(m.rows().back().loss < m.rows().front().loss);
  // Measured and predicted peak share the same categories; after the first
  // step the measured peak is the plan's (the executor's accounting).
  const double measured = static_cast<double>(m.rows().back().peak_bytes);
  const double predicted = static_cast<double>(m.predictedPeakBytes());
  qInfo("measured peak %.0f B, predicted %.0f B", measured, predicted);
  QVERIFY(measured > 0.5 * predicted && measured < 2.0 * predicted);
  QVERIFY(LocalRun::groupMembers(w_->localRun().processGroup()).isEmpty());
}

void LocalRunTest::cancelLeavesNoProcess() {
  QSignalSpy done(w_.get(), &MainWindow::localRunFinished);
  QSignalSpy progress(&w_->localRun(), &LocalRun::progress);
  QVERIFY(w_->runLocally(10000000));
  const QString plan = w_->localRun().planPath();
  QVERIFY(!plan.isEmpty());
  QVERIFY(progress.wait(120000));  // the ranks are training
  QVERIFY(!processesMentioning(plan).isEmpty());  // control: the check sees them
  const qint64 group = w_->localRun().processGroup();
  QVERIFY(!LocalRun::groupMembers(group).isEmpty());
  w_->cancelLocalRun();
  QVERIFY(done.wait(30000));
  QCOMPARE(done.at(0).at(0).toBool(), false);
  QCOMPARE(done.at(0).at(1).toString(), QString("cancelled"));
  QTRY_VERIFY_WITH_TIMEOUT(processesMentioning(plan).isEmpty(), 5000);
  QVERIFY2(LocalRun::groupMembers(group).isEmpty(), "a process of the job's group survived");
  QVERIFY(!w_->localRun().running());
}

QTEST_MAIN(LocalRunTest)
#include "local_run_test.moc"
