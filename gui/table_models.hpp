// The adapters: planner results (engine.hpp) -> Qt item models. The table
// views and the charts both read these models (charts through
// QVBarModelMapper / QVXYModelMapper); nothing here computes a cost, it only
// selects and converts units. Qt::DisplayRole is the formatted number (GiB
// with 2 decimals, ms with 1), kRawRole the exact value (bytes, seconds).
#pragma once

#include "engine.hpp"

#include <QAbstractTableModel>

#include <memory>
#include <utility>

namespace dlplan::gui {

inline constexpr int kRawRole = Qt::UserRole + 1;

// One row per strategy, as the CLI's table.
class StrategyTableModel : public QAbstractTableModel {
  Q_OBJECT

 public:
  enum Column {
    Strategy, Params, Grads, Optimizer, Activations, Gathered, Comm, Workspace, Runtime, Peak, Fits,
    CommGB, CommMs, ComputeMs, StepMs, Mfu,
    HostPerNode,  // CPU offload: host memory per node ("-" without offload)
    ColumnCount
  };
  static constexpr int kFirstCategory = Params, kLastStacked = Runtime;  // the bar chart's stack

  using QAbstractTableModel::QAbstractTableModel;
  void setResults(std::shared_ptr<const Results> r);
  const Results* results() const { return results_.get(); }
  int recommendedRow() const { return results_ ? results_->recommended : -1; }
  double capacityGiB() const;
  // The table's units, chosen by its largest value: ("MiB", 2^20), ("GB/step", 1e9).
  std::pair<QString, double> memoryUnit() const;
  std::pair<QString, double> trafficUnit() const;

  int rowCount(const QModelIndex& parent = {}) const override;
  int columnCount(const QModelIndex& parent = {}) const override;
  QVariant data(const QModelIndex& index, int role = Qt::DisplayRole) const override;
  QVariant headerData(int section, Qt::Orientation o, int role = Qt::DisplayRole) const override;

 private:
  std::shared_ptr<const Results> results_;
};

// The memory curve of one strategy's step: time, then bytes per category
// (GiB), then the running sums that the stacked area chart draws.
class TimelineModel : public QAbstractTableModel {
  Q_OBJECT

 public:
  enum { TimeMs = 0, FirstCategory = 1, FirstCumulative = 1 + kCategories, ColumnCount = 1 + 2 * kCategories };
  using QAbstractTableModel::QAbstractTableModel;
  void setSimulation(std::shared_ptr<const Results> r);  // of r->shown
  const Simulation* simulation() const;
  int strategyRow() const { return row_; }
  const Results* results() const { return results_.get(); }

  int rowCount(const QModelIndex& parent = {}) const override;
  int columnCount(const QModelIndex& parent = {}) const override;
  QVariant data(const QModelIndex& index, int role = Qt::DisplayRole) const override;
  QVariant headerData(int section, Qt::Orientation o, int role = Qt::DisplayRole) const override;

 private:
  std::shared_ptr<const Results> results_;
  int row_ = -1;
  std::vector<int> samples_;  // indices into Simulation::memory (decimated for long steps)
};

// Peak memory (+runtime, GiB) and step time (ms) against the GPU count.
class SweepModel : public QAbstractTableModel {
  Q_OBJECT

 public:
  static constexpr int kStrategies = static_cast<int>(kAllStrategies.size());
  enum { Gpus = 0, FirstPeak = 1, FirstStep = 1 + kStrategies, Capacity = 1 + 2 * kStrategies, ColumnCount = Capacity + 1 };
  using QAbstractTableModel::QAbstractTableModel;
  void setSweep(std::shared_ptr<const Sweep> s);
  const Sweep* sweep() const { return sweep_.get(); }

  int rowCount(const QModelIndex& parent = {}) const override;
  int columnCount(const QModelIndex& parent = {}) const override;
  QVariant data(const QModelIndex& index, int role = Qt::DisplayRole) const override;
  QVariant headerData(int section, Qt::Orientation o, int role = Qt::DisplayRole) const override;

 private:
  std::shared_ptr<const Sweep> sweep_;
  std::vector<int> rows_;  // points the planner accepted
};

// The tensors alive at one strategy's peak, largest first.
class PeakTensorModel : public QAbstractTableModel {
  Q_OBJECT

 public:
  enum { Tensor, Holder, CategoryColumn, Bytes, ColumnCount };
  using QAbstractTableModel::QAbstractTableModel;
  void setResults(std::shared_ptr<const Results> r);  // of r->shown

  int rowCount(const QModelIndex& parent = {}) const override;
  int columnCount(const QModelIndex& parent = {}) const override;
  QVariant data(const QModelIndex& index, int role = Qt::DisplayRole) const override;
  QVariant headerData(int section, Qt::Orientation o, int role = Qt::DisplayRole) const override;

 private:
  std::shared_ptr<const Results> results_;
  const std::vector<LiveTensor>* tensors_ = nullptr;
};

// A local run's progress: loss and measured peak per step, and the peak the
// plan predicted.
class LocalRunModel : public QAbstractTableModel {
  Q_OBJECT

 public:
  enum { Step, Loss, MeasuredMiB, PredictedMiB, ColumnCount };
  struct Row {
    int step = 0;
    double loss = 0;
    qint64 peak_bytes = 0;
    double step_seconds = 0;
  };
  using QAbstractTableModel::QAbstractTableModel;
  void reset(qint64 predictedPeakBytes);
  void append(const Row& r);
  const std::vector<Row>& rows() const { return rows_; }
  qint64 predictedPeakBytes() const { return predicted_; }

  int rowCount(const QModelIndex& parent = {}) const override;
  int columnCount(const QModelIndex& parent = {}) const override;
  QVariant data(const QModelIndex& index, int role = Qt::DisplayRole) const override;
  QVariant headerData(int section, Qt::Orientation o, int role = Qt::DisplayRole) const override;

 private:
  std::vector<Row> rows_;
  qint64 predicted_ = 0;
};

double toGiB(double bytes);

}  // namespace dlplan::gui
