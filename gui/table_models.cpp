#include "table_models.hpp"

#include "dlplan/format.hpp"

#include <QBrush>
#include <QColor>
#include <QFont>

#include <algorithm>
#include <cmath>

namespace dlplan::gui {

double toGiB(double bytes) { return bytes / (1024.0 * 1024.0 * 1024.0); }

namespace {

QString fixed(double v, int decimals) { return QString::number(v, 'f', decimals); }

const char* kCategoryTitles[kCategories] = {"params", "grads", "optim", "activ", "gathered", "comm", "wkspace"};

// A unit per table, as the CLI's: the largest in which the biggest value
// reads at least 1, so a tiny model does not read 0.00.
struct Unit {
  const char* name;
  double size;
};
Unit unitFor(double largest, const Unit (&units)[3]) {
  for (const Unit& u : units)
    if (largest >= u.size) return u;
  return units[2];
}
constexpr Unit kMemoryUnits[3] = {{"GiB", 1024.0 * 1024 * 1024}, {"MiB", 1024.0 * 1024}, {"KiB", 1024.0}};
constexpr Unit kTrafficUnits[3] = {{"GB/step", 1e9}, {"MB/step", 1e6}, {"kB/step", 1e3}};

}  // namespace

// ---- StrategyTableModel -------------------------------------------------------

void StrategyTableModel::setResults(std::shared_ptr<const Results> r) {
  const int before = rowCount();
  const int after = r ? static_cast<int>(r->planning.results.size()) : 0;
  if (before == after && before > 0) {
    results_ = std::move(r);
    emit dataChanged(index(0, 0), index(after - 1, ColumnCount - 1));
    emit headerDataChanged(Qt::Vertical, 0, after - 1);
    emit headerDataChanged(Qt::Horizontal, 0, ColumnCount - 1);  // the units may change
  } else {
    beginResetModel();
    results_ = std::move(r);
    endResetModel();
  }
}

std::pair<QString, double> StrategyTableModel::memoryUnit() const {
  double largest = 0;
  if (results_)
    for (const auto& r : results_->planning.results) largest = std::max(largest, static_cast<double>(r.walk.peak));
  const Unit u = unitFor(largest, kMemoryUnits);
  return {QString::fromLatin1(u.name), u.size};
}

std::pair<QString, double> StrategyTableModel::trafficUnit() const {
  double largest = 0;
  if (results_)
    for (const auto& r : results_->planning.results) largest = std::max(largest, r.comm.bytes);
  const Unit u = unitFor(largest, kTrafficUnits);
  return {QString::fromLatin1(u.name), u.size};
}

double StrategyTableModel::capacityGiB() const { return results_ ? toGiB(static_cast<double>(results_->capacity_bytes)) : 0; }

int StrategyTableModel::rowCount(const QModelIndex& parent) const {
  return parent.isValid() || !results_ ? 0 : static_cast<int>(results_->planning.results.size());
}
int StrategyTableModel::columnCount(const QModelIndex& parent) const { return parent.isValid() ? 0 : ColumnCount; }

QVariant StrategyTableModel::data(const QModelIndex& index, int role) const {
  if (!results_ || !index.isValid()) return {};
  const auto& r = results_->planning.results.at(static_cast<size_t>(index.row()));
  const int c = index.column();
  const bool recommended = index.row() == results_->recommended;
  if (role == Qt::BackgroundRole) {
    if (recommended) return QBrush(QColor(198, 239, 206));
    if (!r.fits) return QBrush(QColor(255, 221, 221));
    return {};
  }
  if (role == Qt::FontRole && recommended) {
    QFont f;
    f.setBold(true);
    return f;
  }
  if (role == Qt::TextAlignmentRole)
    return c == Strategy ? int(Qt::AlignLeft | Qt::AlignVCenter) : int(Qt::AlignRight | Qt::AlignVCenter);
  if (role == Qt::ToolTipRole && c == Strategy && recommended) return tr("recommended");
  if (role == Qt::ToolTipRole && c == HostPerNode && r.training.offload != Offload::none) {
    auto part = [&](Category k) {
      return QString::fromStdString(format_bytes(static_cast<double>(r.host.per_rank[static_cast<size_t>(k)] * r.host.ranks)));
    };
    return tr("host memory per node (%1 ranks): params %2, grads %3, optimizer %4; the node has %5")
        .arg(r.host.ranks)
        .arg(part(Category::params), part(Category::grads), part(Category::optimizer),
             r.host.capacity > 0 ? QString::fromStdString(format_bytes(static_cast<double>(r.host.capacity))) : tr("(not given)"));
  }
  if (role != Qt::DisplayRole && role != kRawRole) return {};
  const bool raw = role == kRawRole;
  const double mem = memoryUnit().second;
  auto bytes = [&](int64_t b) { return raw ? QVariant::fromValue<qint64>(b) : QVariant(fixed(static_cast<double>(b) / mem, 2)); };
  if (c >= Params && c <= Workspace) return bytes(r.walk.at_peak[static_cast<size_t>(c - Params)]);
  switch (c) {
    case Strategy: return QString::fromStdString(to_string(r.strategy)) + (recommended && !raw ? QStringLiteral(" ★") : QString());
    case Runtime: return bytes(r.runtime_bytes);
    case Peak: return bytes(r.walk.peak);
    case Fits: return raw ? QVariant(r.fits) : QVariant(r.fits ? tr("yes") : tr("NO"));
    case CommGB: return raw ? QVariant(r.comm.bytes) : QVariant(fixed(r.comm.bytes / trafficUnit().second, 2));
    case CommMs: return raw ? QVariant(r.comm.seconds) : QVariant(fixed(r.comm.seconds * 1e3, 1));
    case ComputeMs: return raw ? QVariant(r.compute_seconds) : QVariant(fixed(r.compute_seconds * 1e3, 1));
    case StepMs: return raw ? QVariant(r.step_seconds) : QVariant(fixed(r.step_seconds * 1e3, 1));
    case Mfu: return raw ? QVariant(r.mfu) : QVariant(fixed(r.mfu * 100, 1));
    case HostPerNode:
      if (raw) return QVariant::fromValue<qint64>(r.host.per_node);
      return r.training.offload == Offload::none ? QStringLiteral("-")
                                                 : QString::fromStdString(format_bytes(static_cast<double>(r.host.per_node)));
    default: return {};
  }
}

QVariant StrategyTableModel::headerData(int section, Qt::Orientation o, int role) const {
  if (role != Qt::DisplayRole) return QAbstractTableModel::headerData(section, o, role);
  if (o == Qt::Vertical) return section + 1;
  // "comm-buf": communication buffers (memory); "traffic": what a GPU sends
  // per step; "comm": the communication stream's busy time.
  static const char* names[ColumnCount] = {"strategy", "params", "grads", "optim", "activ", "gathered", "comm-buf",
                                           "wkspace", "runtime", "peak", "fits", "traffic", "comm", "compute",
                                           "step", "MFU", "host/node"};
  if (section < 0 || section >= ColumnCount) return {};
  const QString name = tr(names[section]);
  if ((section >= Params && section <= Workspace) || section == Runtime || section == Peak)
    return name + QLatin1Char('\n') + memoryUnit().first;
  switch (section) {
    case CommGB: return name + QLatin1Char('\n') + trafficUnit().first;
    case CommMs: case ComputeMs: case StepMs: return name + QStringLiteral("\nms");
    case Mfu: return name + QStringLiteral("\n%");
    default: return name;
  }
}

// ---- TimelineModel ------------------------------------------------------------

void TimelineModel::setSimulation(std::shared_ptr<const Results> r) {
  beginResetModel();
  results_ = std::move(r);
  row_ = results_ ? results_->shown : -1;
  samples_.clear();
  if (const Simulation* s = simulation()) {
    // A 70B model's step has thousands of samples; keep at most ~1500, always
    // including the largest total of each stride so the peak is never lost.
    const int n = static_cast<int>(s->memory.size());
    const int stride = std::max(1, n / 1500);
    for (int i = 0; i < n; i += stride) {
      int best = i;
      for (int j = i; j < std::min(n, i + stride); ++j)
        if (total(s->memory[static_cast<size_t>(j)].bytes) > total(s->memory[static_cast<size_t>(best)].bytes)) best = j;
      samples_.push_back(best);
    }
  }
  endResetModel();
}

const Simulation* TimelineModel::simulation() const {
  return results_ && row_ >= 0 ? &results_->simulation : nullptr;
}

int TimelineModel::rowCount(const QModelIndex& parent) const { return parent.isValid() ? 0 : static_cast<int>(samples_.size()); }
int TimelineModel::columnCount(const QModelIndex& parent) const { return parent.isValid() ? 0 : ColumnCount; }

QVariant TimelineModel::data(const QModelIndex& index, int role) const {
  const Simulation* s = simulation();
  if (!s || !index.isValid() || (role != Qt::DisplayRole && role != kRawRole)) return {};
  const auto& m = s->memory[static_cast<size_t>(samples_[static_cast<size_t>(index.row())])];
  const int c = index.column();
  if (c == TimeMs) return m.time * 1e3;
  if (c < FirstCumulative) {
    const int64_t b = m.bytes[static_cast<size_t>(c - FirstCategory)];
    return role == kRawRole ? QVariant::fromValue<qint64>(b) : QVariant(toGiB(static_cast<double>(b)));
  }
  int64_t sum = 0;
  for (int k = 0; k <= c - FirstCumulative; ++k) sum += m.bytes[static_cast<size_t>(k)];
  return role == kRawRole ? QVariant::fromValue<qint64>(sum) : QVariant(toGiB(static_cast<double>(sum)));
}

QVariant TimelineModel::headerData(int section, Qt::Orientation o, int role) const {
  if (o != Qt::Horizontal || role != Qt::DisplayRole) return QAbstractTableModel::headerData(section, o, role);
  if (section == TimeMs) return tr("time ms");
  if (section < FirstCumulative) return QString::fromLatin1(kCategoryTitles[section - FirstCategory]);
  return tr("≤ %1").arg(QString::fromLatin1(kCategoryTitles[section - FirstCumulative]));
}

// ---- SweepModel ---------------------------------------------------------------

void SweepModel::setSweep(std::shared_ptr<const Sweep> s) {
  beginResetModel();
  sweep_ = std::move(s);
  rows_.clear();
  if (sweep_)
    for (size_t i = 0; i < sweep_->points.size(); ++i)
      if (sweep_->points[i].ok) rows_.push_back(static_cast<int>(i));
  endResetModel();
}

int SweepModel::rowCount(const QModelIndex& parent) const { return parent.isValid() ? 0 : static_cast<int>(rows_.size()); }
int SweepModel::columnCount(const QModelIndex& parent) const { return parent.isValid() ? 0 : ColumnCount; }

QVariant SweepModel::data(const QModelIndex& index, int role) const {
  if (!sweep_ || !index.isValid() || (role != Qt::DisplayRole && role != kRawRole)) return {};
  const auto& p = sweep_->points[static_cast<size_t>(rows_[static_cast<size_t>(index.row())])];
  const int c = index.column();
  if (c == Gpus) return p.gpus;
  if (c >= FirstPeak && c < FirstStep) {
    const int64_t b = p.total[static_cast<size_t>(c - FirstPeak)];
    return role == kRawRole ? QVariant::fromValue<qint64>(b) : QVariant(toGiB(static_cast<double>(b)));
  }
  if (c >= FirstStep && c < Capacity) {
    const double s = p.step_seconds[static_cast<size_t>(c - FirstStep)];
    return role == kRawRole ? QVariant(s) : QVariant(s * 1e3);
  }
  if (c == Capacity) return toGiB(static_cast<double>(sweep_->capacity_bytes));
  return {};
}

QVariant SweepModel::headerData(int section, Qt::Orientation o, int role) const {
  if (o != Qt::Horizontal || role != Qt::DisplayRole) return QAbstractTableModel::headerData(section, o, role);
  if (section == Gpus) return tr("GPUs");
  if (section == Capacity) return tr("capacity GiB");
  const int s = section < FirstStep ? section - FirstPeak : section - FirstStep;
  const QString name = QString::fromStdString(to_string(kAllStrategies[static_cast<size_t>(s)]));
  return section < FirstStep ? tr("%1 peak+runtime GiB").arg(name) : tr("%1 step ms").arg(name);
}

// ---- PeakTensorModel ----------------------------------------------------------

void PeakTensorModel::setResults(std::shared_ptr<const Results> r) {
  beginResetModel();
  results_ = std::move(r);
  tensors_ = results_ ? &results_->peak_tensors : nullptr;
  endResetModel();
}

int PeakTensorModel::rowCount(const QModelIndex& parent) const {
  return parent.isValid() || !tensors_ ? 0 : static_cast<int>(tensors_->size());
}
int PeakTensorModel::columnCount(const QModelIndex& parent) const { return parent.isValid() ? 0 : ColumnCount; }

QVariant PeakTensorModel::data(const QModelIndex& index, int role) const {
  if (!tensors_ || !index.isValid()) return {};
  const auto& t = (*tensors_)[static_cast<size_t>(index.row())];
  if (role == Qt::TextAlignmentRole && index.column() == Bytes) return int(Qt::AlignRight | Qt::AlignVCenter);
  if (role != Qt::DisplayRole && role != kRawRole) return {};
  switch (index.column()) {
    case Tensor: return QString::fromStdString(t.what);
    case Holder: return QString::fromStdString(t.holder);
    case CategoryColumn: return QString::fromLatin1(to_string(t.category));
    case Bytes:
      return role == kRawRole ? QVariant::fromValue<qint64>(t.bytes)
                              : QVariant(QString::fromStdString(format_bytes(static_cast<double>(t.bytes))));
    default: return {};
  }
}

QVariant PeakTensorModel::headerData(int section, Qt::Orientation o, int role) const {
  if (o != Qt::Horizontal || role != Qt::DisplayRole) return QAbstractTableModel::headerData(section, o, role);
  static const char* names[ColumnCount] = {"tensor", "held by", "category", "bytes"};
  return section >= 0 && section < ColumnCount ? tr(names[section]) : QVariant();
}

// ---- LocalRunModel ------------------------------------------------------------

void LocalRunModel::reset(qint64 predictedPeakBytes) {
  beginResetModel();
  rows_.clear();
  predicted_ = predictedPeakBytes;
  endResetModel();
}

void LocalRunModel::append(const Row& r) {
  const int n = static_cast<int>(rows_.size());
  beginInsertRows({}, n, n);
  rows_.push_back(r);
  endInsertRows();
}

int LocalRunModel::rowCount(const QModelIndex& parent) const { return parent.isValid() ? 0 : static_cast<int>(rows_.size()); }
int LocalRunModel::columnCount(const QModelIndex& parent) const { return parent.isValid() ? 0 : ColumnCount; }

QVariant LocalRunModel::data(const QModelIndex& index, int role) const {
  if (!index.isValid() || (role != Qt::DisplayRole && role != kRawRole)) return {};
  const auto& r = rows_[static_cast<size_t>(index.row())];
  constexpr double MiB = 1024.0 * 1024.0;
  switch (index.column()) {
    case Step: return r.step;
    case Loss: return r.loss;
    case MeasuredMiB: return role == kRawRole ? QVariant::fromValue<qint64>(r.peak_bytes) : QVariant(static_cast<double>(r.peak_bytes) / MiB);
    case PredictedMiB: return role == kRawRole ? QVariant::fromValue<qint64>(predicted_) : QVariant(static_cast<double>(predicted_) / MiB);
    default: return {};
  }
}

QVariant LocalRunModel::headerData(int section, Qt::Orientation o, int role) const {
  if (o != Qt::Horizontal || role != Qt::DisplayRole) return QAbstractTableModel::headerData(section, o, role);
  static const char* names[ColumnCount] = {"step", "loss", "measured peak MiB", "predicted peak MiB"};
  return section >= 0 && section < ColumnCount ? tr(names[section]) : QVariant();
}

}  // namespace dlplan::gui
