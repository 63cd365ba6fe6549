// A model file that does not load: the error (dialog + errorShown) names the
// file and the node, and the previous model, inputs and table stay. Control:
// a good file loads and replaces the model.
#include "main_window.hpp"

#include <QMessageBox>
#include <QSignalSpy>
#include <QTemporaryDir>
#include <QtTest>

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

QString write(const QTemporaryDir& dir, const char* name, const char* text) {
  const QString path = dir.filePath(QString::fromLatin1(name));
  QFile f(path);
  if (!f.open(QIODevice::WriteOnly)) return {};
  f.write(text);
  return path;
}

const char* kBadIr = R"({"name": "bad", "inputs": {"x": {"shape": [8], "dtype": "f32"}, "y": {"shape": [], "dtype": "i32"}},
 "nodes": [{"name": "fc1", "op": "linear", "in": ["x"], "out": 4},
           {"name": "mystery", "op": "frobnicate", "in": ["fc1"]},
           {"name": "loss", "op": "cross_entropy", "in": ["mystery", "y"]}]})";
const char* kGoodIr = R"({"name": "good", "inputs": {"x": {"shape": [8], "dtype": "f32"}, "y": {"shape": [], "dtype": "i32"}},
 "nodes": [{"name": "fc1", "op": "linear", "in": ["x"], "out": 4},
           {"name": "loss", "op": "cross_entropy", "in": ["fc1", "y"]}]})";

}  // namespace

class ErrorTest : public QObject {
  Q_OBJECT

 private slots:
  void badModelFileShowsErrorAndKeepsState_data();
  void badModelFileShowsErrorAndKeepsState();
  void dialogIsShownNonModal();
  void goodFileLoads();

 private:
  QTemporaryDir dir_;
};

void ErrorTest::badModelFileShowsErrorAndKeepsState_data() {
  QTest::addColumn<QString>("file");
  QTest::addColumn<QString>("contents");
  QTest::addColumn<QString>("names");  // what the message must name besides the file
  QTest::newRow("unknown op") << "bad.json" << kBadIr << "mystery";
  QTest::newRow("truncated JSON") << "truncated.json" << R"({"name": )" << "malformed JSON";
  QTest::newRow("missing file") << "" << "" << "";
}

void ErrorTest::badModelFileShowsErrorAndKeepsState() {
  QFETCH(QString, file);
  QFETCH(QString, contents);
  QFETCH(QString, names);
  MainWindow w;
  w.recomputer().setSweepEnabled(false);
  w.setInteractiveErrors(false);
  Inputs in;
  in.model = "gpt2";
  in.gpus_per_node = 4;
  in.micro_batch = 2;
  w.setInputs(in);
  QVERIFY(settle(w));
  const auto before = w.recomputer().results();
  const qint64 peak = w.strategyModel().data(w.strategyModel().index(0, StrategyTableModel::Peak), kRawRole).toLongLong();

  const QString path = file.isEmpty() ? dir_.filePath("does-not-exist.json")
                                      : write(dir_, qPrintable(file), contents.toUtf8().constData());
  QSignalSpy errors(&w, &MainWindow::errorShown);
  w.openModelFile(path);
  QVERIFY(errors.wait(30000));
  const QString text = errors.at(0).at(0).toString();
  QVERIFY2(text.contains(path), qPrintable(text));
  if (!names.isEmpty()) QVERIFY2(text.contains(names), qPrintable(text));
  QVERIFY(settle(w));
  // The previous state is intact: model, inputs, results, table numbers.
  QCOMPARE(w.inputs().model, std::string("gpt2"));
  QVERIFY(w.inputs() == in);
  QCOMPARE(w.recomputer().results().get(), before.get());
  QCOMPARE(w.strategyModel().data(w.strategyModel().index(0, StrategyTableModel::Peak), kRawRole).toLongLong(), peak);
  QCOMPARE(w.strategyModel().rowCount(), 4);
}

void ErrorTest::dialogIsShownNonModal() {
  MainWindow w;
  w.recomputer().setSweepEnabled(false);
  w.setInputs(Inputs{});
  QVERIFY(settle(w));
  QSignalSpy errors(&w, &MainWindow::errorShown);
  const QString path = write(dir_, "bad2.json", kBadIr);
  w.openModelFile(path);  // returns at once: nothing blocks
  QVERIFY(errors.wait(30000));
  QMessageBox* box = nullptr;
  for (auto* b : w.findChildren<QMessageBox*>())
    if (b->isVisible()) box = b;
  QVERIFY(box);
  QVERIFY(box->text().contains(path));
  QVERIFY(box->text().contains("mystery"));
  box->accept();
}

void ErrorTest::goodFileLoads() {
  MainWindow w;
  w.recomputer().setSweepEnabled(false);
  w.setInteractiveErrors(false);
  w.setInputs(Inputs{});
  QVERIFY(settle(w));
  QSignalSpy errors(&w, &MainWindow::errorShown);
  const QString path = write(dir_, "good.json", kGoodIr);
  w.openModelFile(path);
  QVERIFY(settle(w));
  QTRY_COMPARE_WITH_TIMEOUT(QString::fromStdString(w.recomputer().results()->planning.request.model.name), QString("good"), 30000);
  QCOMPARE(errors.count(), 0);
  QCOMPARE(w.inputs().model, path.toStdString());
}

QTEST_MAIN(ErrorTest)
#include "error_test.moc"
