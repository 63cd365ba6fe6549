#include "charts.hpp"

#include "table_models.hpp"

#include <QAreaSeries>
#include <QBarSeries>
#include <QBarCategoryAxis>
#include <QBarSet>
#include <QChart>
#include <QFileInfo>
#include <QLegendMarker>
#include <QLineSeries>
#include <QLogValueAxis>
#include <QPainter>
#include <QStackedBarSeries>
#include <QSvgGenerator>
#include <QVBarModelMapper>
#include <QVXYModelMapper>
#include <QValueAxis>

#include <algorithm>
#include <cmath>
#include <limits>

namespace dlplan::gui {
namespace {

// One colour per memory category (+ runtime), shared by every chart.
const QColor kCategoryColors[] = {QColor(0x4e79a7), QColor(0xf28e2b), QColor(0xe15759), QColor(0x76b7b2),
                                  QColor(0x59a14f), QColor(0xedc948), QColor(0xb07aa1), QColor(0xbab0ac)};
const QColor kStrategyColors[] = {QColor(0x4e79a7), QColor(0xf28e2b), QColor(0x59a14f),
                                  QColor(0xe15759), QColor(0x76b7b2), QColor(0xb07aa1)};
static_assert(std::size(kStrategyColors) == kAllStrategies.size(), "one colour per strategy");

// The strategy of results row `row` ("" when there is none).
QString strategyOfRow(const Results* r, int row) {
  if (!r || row < 0 || static_cast<size_t>(row) >= r->planning.results.size()) return {};
  return QString::fromStdString(to_string(r->planning.results[static_cast<size_t>(row)].strategy));
}

QChartView* makeView(QChart* chart, QWidget* parent) {
  chart->setAnimationOptions(QChart::NoAnimation);
  chart->setMargins(QMargins(4, 4, 4, 4));
  chart->legend()->setAlignment(Qt::AlignBottom);
  QFont f = chart->legend()->font();
  f.setPointSizeF(f.pointSizeF() * 0.85);
  chart->legend()->setFont(f);
  auto* view = new QChartView(chart, parent);
  view->setRenderHint(QPainter::Antialiasing);
  view->setMinimumSize(320, 220);
  return view;
}

// Y axis from 0 to a rounded max over the mapped series.
void fitY(QValueAxis* axis, double max) {
  if (!(max > 0) || !std::isfinite(max)) max = 1;
  axis->setRange(0, max * 1.08);
  axis->applyNiceNumbers();
}

double maxY(const QXYSeries* s) {
  double m = 0;
  for (const QPointF& p : s->points()) m = std::max(m, p.y());
  return m;
}

}  // namespace

QChartView* makeMemoryBarChart(StrategyTableModel* model, QWidget* parent) {
  auto* chart = new QChart;
  chart->setTitle(QObject::tr("Memory per GPU at the peak, GiB"));
  auto* bars = new QStackedBarSeries(chart);
  auto* mapper = new QVBarModelMapper(chart);
  mapper->setFirstBarSetColumn(StrategyTableModel::kFirstCategory);
  mapper->setLastBarSetColumn(StrategyTableModel::kLastStacked);
  mapper->setSeries(bars);
  mapper->setModel(model);
  chart->addSeries(bars);

  auto* capacity = new QLineSeries(chart);
  capacity->setName(QObject::tr("capacity"));
  QPen pen(Qt::red);
  pen.setWidthF(2);
  pen.setStyle(Qt::DashLine);
  capacity->setPen(pen);
  chart->addSeries(capacity);

  auto* x = new QBarCategoryAxis(chart);
  auto* y = new QValueAxis(chart);
  y->setLabelFormat(QStringLiteral("%.0f"));
  chart->addAxis(x, Qt::AlignBottom);
  chart->addAxis(y, Qt::AlignLeft);
  bars->attachAxis(x);
  bars->attachAxis(y);
  auto* xline = new QValueAxis(chart);  // hidden: the capacity line spans the bars
  chart->addAxis(xline, Qt::AlignTop);
  xline->setVisible(false);
  capacity->attachAxis(xline);
  capacity->attachAxis(y);

  auto refresh = [=] {
    const int rows = model->rowCount();
    QStringList cats;
    double top = model->capacityGiB();
    for (int r = 0; r < rows; ++r) {
      cats << model->data(model->index(r, StrategyTableModel::Strategy), kRawRole).toString();
      double sum = 0;
      for (int c = StrategyTableModel::kFirstCategory; c <= StrategyTableModel::kLastStacked; ++c)
        sum += model->data(model->index(r, c)).toDouble();
      top = std::max(top, sum);
    }
    x->setCategories(cats);
    xline->setRange(-0.5, std::max(rows, 1) - 0.5);
    capacity->replace(QList<QPointF>{{-0.5, model->capacityGiB()}, {std::max(rows, 1) - 0.5, model->capacityGiB()}});
    fitY(y, top);
  };
  QObject::connect(model, &QAbstractItemModel::modelReset, chart, refresh);
  QObject::connect(model, &QAbstractItemModel::dataChanged, chart, refresh);
  // The mapper creates the bar sets (one per category column) on a reset;
  // they are styled as they arrive, never through a stale barSets() list.
  QObject::connect(bars, &QBarSeries::barsetsAdded, chart, [bars](const QList<QBarSet*>&) {
    const auto sets = bars->barSets();
    for (int i = 0; i < sets.size(); ++i) {
      const QColor c = kCategoryColors[i % 8];
      if (sets[i]->color() != c) sets[i]->setColor(c);
      if (sets[i]->borderColor() != c.darker(120)) sets[i]->setBorderColor(c.darker(120));
      const QString label = i < kCategories ? QString::fromLatin1(to_string(kAllCategories[static_cast<size_t>(i)])) : QObject::tr("runtime");
      if (sets[i]->label() != label) sets[i]->setLabel(label);
    }
  });
  refresh();
  return makeView(chart, parent);
}

QChartView* makeTimelineChart(TimelineModel* model, QWidget* parent) {
  auto* chart = new QChart;
  chart->setTitle(QObject::tr("Memory over the step, GiB"));
  auto* x = new QValueAxis(chart);
  x->setTitleText(QObject::tr("ms"));
  x->setLabelFormat(QStringLiteral("%.1f"));
  auto* y = new QValueAxis(chart);
  y->setLabelFormat(QStringLiteral("%.1f"));
  chart->addAxis(x, Qt::AlignBottom);
  chart->addAxis(y, Qt::AlignLeft);
  QLineSeries* lower = nullptr;
  std::vector<QLineSeries*> uppers;
  for (int k = 0; k < kCategories; ++k) {
    auto* upper = new QLineSeries(chart);
    auto* mapper = new QVXYModelMapper(chart);
    mapper->setXColumn(TimelineModel::TimeMs);
    mapper->setYColumn(TimelineModel::FirstCumulative + k);
    mapper->setSeries(upper);
    mapper->setModel(model);
    auto* area = new QAreaSeries(upper, lower);
    area->setName(QString::fromLatin1(to_string(kAllCategories[static_cast<size_t>(k)])));
    area->setColor(kCategoryColors[k]);
    area->setBorderColor(kCategoryColors[k].darker(130));
    chart->addSeries(area);
    area->attachAxis(x);
    area->attachAxis(y);
    uppers.push_back(upper);
    lower = upper;
  }
  auto refresh = [=] {
    double tmax = 0;
    for (int r = 0; r < model->rowCount(); ++r) tmax = std::max(tmax, model->data(model->index(r, TimelineModel::TimeMs)).toDouble());
    x->setRange(0, tmax > 0 ? tmax : 1);
    fitY(y, maxY(uppers.back()));
    const Simulation* s = model->simulation();
    chart->setTitle(s ? QObject::tr("Memory over the step (%1), GiB")
                            .arg(strategyOfRow(model->results(), model->strategyRow()))
                      : QObject::tr("Memory over the step, GiB"));
  };
  QObject::connect(model, &QAbstractItemModel::modelReset, chart, refresh);
  refresh();
  return makeView(chart, parent);
}

QChartView* makeSweepChart(SweepModel* model, bool memory, QWidget* parent) {
  auto* chart = new QChart;
  chart->setTitle(memory ? QObject::tr("Peak + runtime per GPU vs GPU count, GiB") : QObject::tr("Step time vs GPU count, ms"));
  auto* x = new QLogValueAxis(chart);
  x->setBase(2);
  x->setLabelFormat(QStringLiteral("%d"));
  x->setRange(1, 1024);
  x->setMinorTickCount(0);
  auto* y = new QValueAxis(chart);
  y->setLabelFormat(memory ? QStringLiteral("%.0f") : QStringLiteral("%.0f"));
  chart->addAxis(x, Qt::AlignBottom);
  chart->addAxis(y, Qt::AlignLeft);
  std::vector<QLineSeries*> lines;
  for (int s = 0; s < SweepModel::kStrategies; ++s) {
    auto* line = new QLineSeries(chart);
    line->setName(QString::fromStdString(to_string(kAllStrategies[static_cast<size_t>(s)])));
    line->setPointsVisible(true);
    QPen pen(kStrategyColors[s]);
    pen.setWidthF(2);
    line->setPen(pen);
    auto* mapper = new QVXYModelMapper(chart);
    mapper->setXColumn(SweepModel::Gpus);
    mapper->setYColumn((memory ? SweepModel::FirstPeak : SweepModel::FirstStep) + s);
    mapper->setSeries(line);
    mapper->setModel(model);
    chart->addSeries(line);
    line->attachAxis(x);
    line->attachAxis(y);
    lines.push_back(line);
  }
  QLineSeries* capacity = nullptr;
  if (memory) {
    capacity = new QLineSeries(chart);
    capacity->setName(QObject::tr("capacity"));
    QPen pen(Qt::red);
    pen.setWidthF(2);
    pen.setStyle(Qt::DashLine);
    capacity->setPen(pen);
    auto* mapper = new QVXYModelMapper(chart);
    mapper->setXColumn(SweepModel::Gpus);
    mapper->setYColumn(SweepModel::Capacity);
    mapper->setSeries(capacity);
    mapper->setModel(model);
    chart->addSeries(capacity);
    capacity->attachAxis(x);
    capacity->attachAxis(y);
  }
  auto refresh = [=] {
    double top = 0;
    for (auto* l : lines) {
      top = std::max(top, maxY(l));
      l->setVisible(maxY(l) > 0);  // a strategy the planning did not compare (ddp under --offload)
    }
    if (capacity) top = std::min(std::max(top, maxY(capacity)), 3 * std::max(maxY(capacity), 1.0));
    fitY(y, top);
  };
  QObject::connect(model, &QAbstractItemModel::modelReset, chart, refresh);
  refresh();
  return makeView(chart, parent);
}

QChartView* makeLocalRunChart(LocalRunModel* model, QWidget* parent) {
  auto* chart = new QChart;
  chart->setTitle(QObject::tr("Local run: loss, and peak memory measured vs predicted"));
  auto* x = new QValueAxis(chart);
  x->setTitleText(QObject::tr("step"));
  x->setLabelFormat(QStringLiteral("%d"));
  auto* yLoss = new QValueAxis(chart);
  yLoss->setTitleText(QObject::tr("loss"));
  auto* yMem = new QValueAxis(chart);
  yMem->setTitleText(QObject::tr("MiB"));
  chart->addAxis(x, Qt::AlignBottom);
  chart->addAxis(yLoss, Qt::AlignLeft);
  chart->addAxis(yMem, Qt::AlignRight);
  auto add = [&](int column, const QString& name, QValueAxis* y, QColor color, Qt::PenStyle style) {
    auto* line = new QLineSeries(chart);
    line->setName(name);
    QPen pen(color);
    pen.setWidthF(2);
    pen.setStyle(style);
    line->setPen(pen);
    auto* mapper = new QVXYModelMapper(chart);
    mapper->setXColumn(LocalRunModel::Step);
    mapper->setYColumn(column);
    mapper->setSeries(line);
    mapper->setModel(model);
    chart->addSeries(line);
    line->attachAxis(x);
    line->attachAxis(y);
    return line;
  };
  auto* loss = add(LocalRunModel::Loss, QObject::tr("loss"), yLoss, QColor(0x4e79a7), Qt::SolidLine);
  auto* measured = add(LocalRunModel::MeasuredMiB, QObject::tr("measured peak"), yMem, QColor(0xf28e2b), Qt::SolidLine);
  auto* predicted = add(LocalRunModel::PredictedMiB, QObject::tr("predicted peak"), yMem, QColor(0xe15759), Qt::DashLine);
  auto refresh = [=] {
    x->setRange(1, std::max(2, model->rowCount()));
    fitY(yLoss, maxY(loss));
    fitY(yMem, std::max(maxY(measured), maxY(predicted)));
  };
  QObject::connect(model, &QAbstractItemModel::modelReset, chart, refresh);
  QObject::connect(model, &QAbstractItemModel::rowsInserted, chart, refresh);
  refresh();
  return makeView(chart, parent);
}

// ---- GanttWidget --------------------------------------------------------------

GanttWidget::GanttWidget(QWidget* parent) : QWidget(parent) {
  setMinimumSize(320, 160);
  setAutoFillBackground(true);
  setPalette(QPalette(Qt::white));
}

void GanttWidget::setSimulation(std::shared_ptr<const Results> r) {
  results_ = std::move(r);
  row_ = results_ ? results_->shown : -1;
  update();
}

const Simulation* GanttWidget::simulation() const {
  return results_ && row_ >= 0 ? &results_->simulation : nullptr;
}

void GanttWidget::paintEvent(QPaintEvent*) {
  QPainter p(this);
  p.setRenderHint(QPainter::Antialiasing, false);
  p.fillRect(rect(), Qt::white);
  const Simulation* s = simulation();
  const QFontMetrics fm = p.fontMetrics();
  const int left = fm.horizontalAdvance(QStringLiteral("communication")) + 12, right = 12, top = fm.height() + 10;
  const int axisH = fm.height() + 8, legendH = fm.height() + 6;
  const int laneGap = 10;
  const int laneH = std::max(14, (height() - top - axisH - legendH - laneGap - 6) / 2);
  const int width = std::max(10, this->width() - left - right);
  QFont bold = p.font();
  bold.setBold(true);
  p.setFont(bold);
  const QString strategy = strategyOfRow(results_.get(), row_);
  p.drawText(QRect(0, 2, this->width(), fm.height() + 4), Qt::AlignHCenter,
             s ? tr("%1 step: %2 ms, exposed comm %3 ms")
                     .arg(strategy).arg(s->step_seconds * 1e3, 0, 'f', 1).arg(s->exposed_seconds * 1e3, 0, 'f', 1)
               : tr("Step timeline"));
  p.setFont(font());
  if (!s || s->step_seconds <= 0) return;
  const double span = std::max({s->step_seconds, s->compute.empty() ? 0.0 : s->compute.back().end,
                                s->comm.empty() ? 0.0 : s->comm.back().end});
  auto X = [&](double t) { return left + static_cast<int>(std::lround(t / span * width)); };
  const int y0 = top, y1 = top + laneH + laneGap;
  p.setPen(Qt::black);
  p.drawText(QRect(0, y0, left - 6, laneH), Qt::AlignRight | Qt::AlignVCenter, tr("compute"));
  p.drawText(QRect(0, y1, left - 6, laneH), Qt::AlignRight | Qt::AlignVCenter, tr("communication"));
  p.fillRect(QRect(left, y0, width, laneH), QColor(245, 245, 245));
  p.fillRect(QRect(left, y1, width, laneH), QColor(245, 245, 245));
  const QColor phase[] = {QColor(0x4e79a7), QColor(0xf28e2b), QColor(0xb07aa1), QColor(0x59a14f)};
  for (const auto& sp : s->compute) {
    const int a = X(sp.start), b = std::max(X(sp.end), a + 1);
    p.fillRect(QRect(a, y0 + 2, b - a, laneH - 4), phase[static_cast<int>(sp.phase) % 4]);
  }
  for (const auto& sp : s->comm) {
    const int a = X(sp.start), b = std::max(X(sp.end), a + 1);
    QColor c = QColor(0xe15759);
    if (sp.op == Collective::AllGather) c = QColor(0x76b7b2);
    else if (sp.op == Collective::ReduceScatter) c = QColor(0xedc948);
    p.fillRect(QRect(a, y1 + 2, b - a, laneH - 4), c);
    p.setPen(c.darker(150));
    p.drawLine(a, y1 + 2, a, y1 + laneH - 3);  // span boundaries stay visible
  }
  // Time axis.
  const int ya = y1 + laneH + 2;
  p.setPen(Qt::darkGray);
  p.drawLine(left, ya, left + width, ya);
  const double ms = span * 1e3;
  const double raw = ms / 8;
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  const double step = raw / mag < 2 ? 2 * mag : raw / mag < 5 ? 5 * mag : 10 * mag;
  for (double t = 0; t <= ms + 1e-9; t += step) {
    const int x = X(t / 1e3);
    p.drawLine(x, ya, x, ya + 3);
    p.drawText(QRect(x - 40, ya + 3, 80, fm.height()), Qt::AlignHCenter, QString::number(t, 'g', 4) + QStringLiteral(" ms"));
  }
  // Legend.
  struct Item { QColor c; QString t; };
  const Item items[] = {{phase[0], tr("forward")}, {phase[1], tr("backward")}, {phase[2], tr("recompute")},
                        {phase[3], tr("optimizer")}, {QColor(0xe15759), tr("all-reduce")},
                        {QColor(0x76b7b2), tr("all-gather")}, {QColor(0xedc948), tr("reduce-scatter")}};
  int x = left;
  const int yl = ya + fm.height() + 6;
  p.setPen(Qt::black);
  for (const auto& it : items) {
    p.fillRect(QRect(x, yl + 2, 10, fm.height() - 4), it.c);
    p.drawText(QPoint(x + 14, yl + fm.ascent()), it.t);
    x += 14 + fm.horizontalAdvance(it.t) + 12;
  }
}

// ---- export -------------------------------------------------------------------

bool exportWidget(QWidget* w, const QString& path, const QString& title) {
  if (!w || path.isEmpty()) return false;
  if (QFileInfo(path).suffix().compare(QLatin1String("svg"), Qt::CaseInsensitive) == 0) {
    QSvgGenerator gen;
    gen.setFileName(path);
    gen.setSize(w->size());
    gen.setViewBox(QRect(QPoint(0, 0), w->size()));
    gen.setTitle(title.isEmpty() ? QStringLiteral("dlplan chart") : title);
    gen.setDescription(QStringLiteral("Exported by dlplan-gui"));
    QPainter painter;
    if (!painter.begin(&gen)) return false;
    w->render(&painter);
    painter.end();
    return QFileInfo(path).size() > 0;
  }
  return w->grab().save(path);
}

}  // namespace dlplan::gui
