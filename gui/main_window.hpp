// The what-if window: inputs on the left, the strategy table, the
// recommendation and the charts on the right. Every input change schedules a
// recompute (recomputer.hpp); results arrive as new models for the table and
// the charts. Nothing here computes a cost.
#pragma once

#include "charts.hpp"
#include "engine.hpp"
#include "local_run.hpp"
#include "recomputer.hpp"
#include "table_models.hpp"

#include <QMainWindow>
#include <QMap>

class QComboBox;
class QDoubleSpinBox;
class QLabel;
class QLineEdit;
class QPlainTextEdit;
class QPushButton;
class QSpinBox;
class QTableView;
class QTextBrowser;

namespace dlplan::gui {

class MainWindow : public QMainWindow {
  Q_OBJECT

 public:
  explicit MainWindow(QWidget* parent = nullptr);
  ~MainWindow() override;

  // Sets every control from `in` and recomputes.
  void setInputs(const Inputs& in);
  const Inputs& inputs() const { return inputs_; }
  const Inputs& lastGoodInputs() const { return lastGood_; }
  bool hasResults() const { return strategyModel_.results() != nullptr; }

  // Errors: always errorShown(text); with interactive errors (the default)
  // also a non-modal QMessageBox.
  void setInteractiveErrors(bool on) { interactiveErrors_ = on; }

  // The file behind "Open…": loads it as the model (error dialog on failure;
  // the previous model and results stay).
  void openModelFile(const QString& path);
  // The row the timeline, Gantt and tensors show (default: the recommended).
  void selectStrategyRow(int row);
  int selectedRow() const { return selectedRow_; }

  bool savePlan(const QString& path);                   // the selected row's plan, as `dlplan --out`
  bool exportChart(const QString& name, const QString& path);  // names: chartNames()
  QStringList chartNames() const { return charts_.keys(); }
  bool runLocally(int steps = 20);                      // the selected strategy on `cpu`, 2 ranks, fp32
  void cancelLocalRun();

  Recomputer& recomputer() { return recomputer_; }
  StrategyTableModel& strategyModel() { return strategyModel_; }
  TimelineModel& timelineModel() { return timelineModel_; }
  SweepModel& sweepModel() { return sweepModel_; }
  PeakTensorModel& tensorModel() { return tensorModel_; }
  LocalRunModel& runModel() { return runModel_; }
  LocalRun& localRun() { return localRun_; }
  GanttWidget* gantt() const { return gantt_; }
  QString recommendationText() const;

 signals:
  void errorShown(const QString& text);
  void resultsShown(quint64 generation);
  void sweepShown(quint64 generation);
  void localRunFinished(bool ok, const QString& message);

 private:
  void buildUi();
  QWidget* buildInputs();
  QWidget* chartPanel(const QString& name, QWidget* chart);
  void fillControls(const Inputs& in);
  void readControls();
  void inputsEdited();
  void recompute();
  void showResults(quint64 generation);
  void showSweep(quint64 generation);
  void showFailure(quint64 generation, const QString& message, const Inputs& failed);
  void showError(const QString& text);
  void updateSelection();
  void modelChosen(int index);
  void chooseClusterFile();
  void exportInteractive(const QString& name);
  void savePlanInteractive();

  Recomputer recomputer_;
  StrategyTableModel strategyModel_;
  TimelineModel timelineModel_;
  SweepModel sweepModel_;
  PeakTensorModel tensorModel_;
  LocalRunModel runModel_;
  LocalRun localRun_;

  Inputs inputs_, lastGood_;
  bool haveGood_ = false;
  bool interactiveErrors_ = true;
  bool filling_ = false;
  int selectedRow_ = -1;
  std::optional<Strategy> selectedStrategy_;  // the user's pick survives recomputes

  QComboBox *offload_ = nullptr;
  QLineEdit *freeze_ = nullptr, *loraTargets_ = nullptr;  // fine-tuning (--freeze, --lora-targets)
  QSpinBox *lora_ = nullptr;                               // --lora (0: none)
  QDoubleSpinBox *loraAlpha_ = nullptr;                    // --lora-alpha (0: alpha = rank)
  QComboBox *modelCombo_ = nullptr, *gpuCombo_ = nullptr, *batchMode_ = nullptr, *precision_ = nullptr,
            *optimizer_ = nullptr, *checkpointing_ = nullptr, *attention_ = nullptr, *fusion_ = nullptr, *syncbn_ = nullptr,
            *strategy_ = nullptr;
  QSpinBox *nodes_ = nullptr, *gpusPerNode_ = nullptr, *batch_ = nullptr, *gradAccum_ = nullptr, *seqLen_ = nullptr,
           *prefetch_ = nullptr, *shardGroup_ = nullptr, *steps_ = nullptr;
  QDoubleSpinBox *bucketMb_ = nullptr, *lr_ = nullptr;
  QLabel *clusterLabel_ = nullptr, *status_ = nullptr, *runStatus_ = nullptr;
  QPushButton *clusterButton_ = nullptr, *runButton_ = nullptr, *cancelButton_ = nullptr;
  QTableView* table_ = nullptr;
  QTextBrowser* advice_ = nullptr;
  QPlainTextEdit* runLog_ = nullptr;
  GanttWidget* gantt_ = nullptr;
  QMap<QString, QWidget*> charts_;
};

}  // namespace dlplan::gui
