// Charts built from the table models (table_models.hpp) through Qt Charts'
// model mappers; the charts never call the planner. The Gantt chart of the
// step is a small custom widget over a Simulation's two streams.
#pragma once

#include "engine.hpp"

#include <QChartView>
#include <QWidget>

#include <memory>

namespace dlplan::gui {

class StrategyTableModel;
class TimelineModel;
class SweepModel;
class LocalRunModel;

// Stacked bars of memory per category for each strategy, and the device's
// capacity as a line.
QChartView* makeMemoryBarChart(StrategyTableModel* model, QWidget* parent = nullptr);
// Stacked areas of the selected strategy's memory over the step.
QChartView* makeTimelineChart(TimelineModel* model, QWidget* parent = nullptr);
// One line per strategy against the GPU count (log2 axis): peak + runtime
// (with the capacity line) when `memory`, else the step time.
QChartView* makeSweepChart(SweepModel* model, bool memory, QWidget* parent = nullptr);
// A local run: loss, and measured against predicted peak memory.
QChartView* makeLocalRunChart(LocalRunModel* model, QWidget* parent = nullptr);

// Two lanes, compute and communication, one bar per span.
class GanttWidget : public QWidget {
  Q_OBJECT

 public:
  explicit GanttWidget(QWidget* parent = nullptr);
  void setSimulation(std::shared_ptr<const Results> r);  // of r->shown
  const Simulation* simulation() const;
  QSize sizeHint() const override { return {600, 220}; }

 protected:
  void paintEvent(QPaintEvent* e) override;

 private:
  std::shared_ptr<const Results> results_;
  int row_ = -1;
};

// Saves a widget (a chart view, the Gantt widget) as PNG (or any raster
// format Qt knows by the suffix) or, for *.svg, as SVG. False on failure.
bool exportWidget(QWidget* w, const QString& path, const QString& title = {});

}  // namespace dlplan::gui
