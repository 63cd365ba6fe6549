// The strategy table's units and names, as the CLI's: the memory unit chosen
// by the table's largest peak (a tiny model reads in MiB or KiB, not 0.00),
// the traffic unit likewise, and no two columns with the same name. The
// recommendation text is the planner's, line for line.
#include "table_models.hpp"

#include <QSet>
#include <QtTest>

using namespace dlplan;
using namespace dlplan::gui;

namespace {

std::shared_ptr<const Results> results(const char* model, const char* gpu, int gpus) {
  Inputs in;
  in.model = model;
  in.gpu = gpu;
  in.nodes = 1;
  in.gpus_per_node = gpus;
  in.micro_batch = 8;
  Engine e;
  return std::make_shared<const Results>(e.compute(in));
}

}  // namespace

class UnitsTest : public QObject {
  Q_OBJECT

 private slots:
  void tinyModelReadsInASmallerUnit() {
    StrategyTableModel m;
    m.setResults(results("tiny-gpt", "cpu", 2));
    const QString unit = m.memoryUnit().first;
    QVERIFY2(unit == QStringLiteral("MiB") || unit == QStringLiteral("KiB"), qPrintable(unit));
    QVERIFY(m.headerData(StrategyTableModel::Peak, Qt::Horizontal).toString().endsWith(unit));
    for (int row = 0; row < m.rowCount(); ++row) {
      const double shown = m.data(m.index(row, StrategyTableModel::Peak)).toString().toDouble();
      const double bytes = m.data(m.index(row, StrategyTableModel::Peak), kRawRole).toDouble();
      QVERIFY2(shown >= 1.0, qPrintable(QString::number(shown)));
      QVERIFY(qAbs(shown * m.memoryUnit().second - bytes) <= 0.01 * m.memoryUnit().second);
    }
    // Control: a 7B model keeps GiB.
    StrategyTableModel big;
    big.setResults(results("llama2-7b", "h100-80g", 8));
    QCOMPARE(big.memoryUnit().first, QStringLiteral("GiB"));
  }

  void columnNamesAreDistinct() {
    StrategyTableModel m;
    m.setResults(results("gpt2", "h100-80g", 8));
    QSet<QString> names;
    for (int c = 0; c < m.columnCount(); ++c) {
      const QString name = m.headerData(c, Qt::Horizontal).toString().split(QLatin1Char('\n')).front();
      QVERIFY2(!names.contains(name), qPrintable(name));
      names.insert(name);
    }
    QVERIFY(names.contains(QStringLiteral("comm-buf")));
    QVERIFY(names.contains(QStringLiteral("traffic")));
  }
};

QTEST_GUILESS_MAIN(UnitsTest)
#include "units_test.moc"
