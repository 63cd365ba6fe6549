#include "main_window.hpp"

#include "dlplan/fine_tuning.hpp"
#include "dlplan/format.hpp"
#include "dlplan/hardware.hpp"
#include "dlplan/loader.hpp"
#include "dlplan/request.hpp"
#include "dlplan/zoo.hpp"

#include <QComboBox>
#include <QFileDialog>
#include <QFileInfo>
#include <QFormLayout>
#include <QGridLayout>
#include <QGroupBox>
#include <QHBoxLayout>
#include <QHeaderView>
#include <QLabel>
#include <QLineEdit>
#include <QMenuBar>
#include <QMessageBox>
#include <QPlainTextEdit>
#include <QPushButton>
#include <QSaveFile>
#include <QSpinBox>
#include <QSplitter>
#include <QTabWidget>
#include <QTableView>
#include <QTextBrowser>
#include <QToolButton>
#include <QVBoxLayout>

#include <tuple>

namespace dlplan::gui {
namespace {

QString qs(const std::string& s) { return QString::fromStdString(s); }

QComboBox* combo(const QStringList& items, QWidget* parent) {
  auto* c = new QComboBox(parent);
  c->addItems(items);
  return c;
}

void setComboText(QComboBox* c, const QString& text) {
  const int i = c->findData(text) >= 0 ? c->findData(text) : c->findText(text);
  if (i >= 0) c->setCurrentIndex(i);
}

const QString kOpenItem = QStringLiteral("Open…");

}  // namespace

MainWindow::MainWindow(QWidget* parent) : QMainWindow(parent) {
  buildUi();
  connect(&recomputer_, &Recomputer::resultsReady, this, &MainWindow::showResults);
  connect(&recomputer_, &Recomputer::sweepReady, this, &MainWindow::showSweep);
  connect(&recomputer_, &Recomputer::failed, this, &MainWindow::showFailure);
  connect(&localRun_, &LocalRun::progress, this, [this](int step, int steps, double loss, qint64 peak, double seconds) {
    runModel_.append({step, loss, peak, seconds});
    runStatus_->setText(tr("step %1/%2  loss %3  peak %4").arg(step).arg(steps).arg(loss, 0, 'f', 4)
                            .arg(qs(format_bytes(static_cast<double>(peak)))));
  });
  connect(&localRun_, &LocalRun::outputLine, this, [this](const QString& l) { runLog_->appendPlainText(l); });
  connect(&localRun_, &LocalRun::finished, this, [this](bool ok, const QString& msg) {
    runButton_->setEnabled(true);
    cancelButton_->setEnabled(false);
    runStatus_->setText(runStatus_->text() + QStringLiteral("  —  ") + msg);
    runLog_->appendPlainText(msg);
    emit localRunFinished(ok, msg);
  });
  setInputs(Inputs{});
}

MainWindow::~MainWindow() = default;

// ---- layout -------------------------------------------------------------------

void MainWindow::buildUi() {
  setWindowTitle(tr("dlplan — what-if explorer"));
  auto* file = menuBar()->addMenu(tr("&File"));
  file->addAction(tr("Open model…"), this, [this] {
    const QString path = QFileDialog::getOpenFileName(this, tr("Open model"), {},
                                                      tr("Models (*.json *.onnx);;All files (*)"));
    if (!path.isEmpty()) openModelFile(path);
  });
  file->addAction(tr("Save plan…"), this, &MainWindow::savePlanInteractive);
  file->addSeparator();
  file->addAction(tr("Quit"), this, &QWidget::close);

  auto* central = new QWidget(this);
  auto* h = new QHBoxLayout(central);
  h->setContentsMargins(6, 6, 6, 6);
  h->addWidget(buildInputs());

  auto* right = new QVBoxLayout;
  table_ = new QTableView(central);
  table_->setModel(&strategyModel_);
  table_->setSelectionBehavior(QAbstractItemView::SelectRows);
  table_->setSelectionMode(QAbstractItemView::SingleSelection);
  table_->horizontalHeader()->setSectionResizeMode(QHeaderView::Stretch);
  table_->verticalHeader()->setVisible(false);
  table_->verticalHeader()->setDefaultSectionSize(table_->fontMetrics().height() + 6);
  table_->setFixedHeight(table_->fontMetrics().height() * 2 + 12 + 4 * (table_->fontMetrics().height() + 6) + 6);
  connect(table_->selectionModel(), &QItemSelectionModel::currentRowChanged, this, [this](const QModelIndex& cur) {
    if (!filling_ && cur.isValid()) selectStrategyRow(cur.row());
  });
  right->addWidget(table_);

  advice_ = new QTextBrowser(central);
  advice_->setMaximumHeight(120);
  right->addWidget(advice_);

  auto* tabs = new QTabWidget(central);
  auto* overview = new QWidget(tabs);
  auto* grid = new QGridLayout(overview);
  grid->setContentsMargins(2, 2, 2, 2);
  gantt_ = new GanttWidget(overview);
  grid->addWidget(chartPanel(QStringLiteral("memory"), makeMemoryBarChart(&strategyModel_)), 0, 0);
  grid->addWidget(chartPanel(QStringLiteral("timeline"), makeTimelineChart(&timelineModel_)), 0, 1);
  grid->addWidget(chartPanel(QStringLiteral("gantt"), gantt_), 1, 0);
  grid->addWidget(chartPanel(QStringLiteral("sweep-memory"), makeSweepChart(&sweepModel_, true)), 1, 1);
  grid->setRowStretch(0, 3);
  grid->setRowStretch(1, 2);
  tabs->addTab(overview, tr("Overview"));

  auto* sweep = new QWidget(tabs);
  auto* sh = new QHBoxLayout(sweep);
  sh->addWidget(chartPanel(QStringLiteral("sweep-memory-large"), makeSweepChart(&sweepModel_, true)));
  sh->addWidget(chartPanel(QStringLiteral("sweep-step"), makeSweepChart(&sweepModel_, false)));
  tabs->addTab(sweep, tr("GPU-count sweep"));

  auto* tensors = new QTableView(tabs);
  tensors->setModel(&tensorModel_);
  tensors->horizontalHeader()->setSectionResizeMode(QHeaderView::Stretch);
  tensors->verticalHeader()->setVisible(false);
  tabs->addTab(tensors, tr("Tensors at the peak"));

  auto* run = new QWidget(tabs);
  auto* rv = new QVBoxLayout(run);
  auto* bar = new QHBoxLayout;
  runButton_ = new QPushButton(tr("Run locally"), run);
  runButton_->setToolTip(tr("Re-plan the selected strategy for the cpu device with 2 ranks (fp32) and train it with mpirun"));
  cancelButton_ = new QPushButton(tr("Cancel"), run);
  cancelButton_->setEnabled(false);
  steps_ = new QSpinBox(run);
  steps_->setRange(1, 1000000);
  steps_->setValue(20);
  steps_->setPrefix(tr("steps "));
  runStatus_ = new QLabel(run);
  bar->addWidget(runButton_);
  bar->addWidget(cancelButton_);
  bar->addWidget(steps_);
  bar->addWidget(runStatus_, 1);
  rv->addLayout(bar);
  auto* runSplit = new QSplitter(Qt::Horizontal, run);
  runSplit->addWidget(chartPanel(QStringLiteral("local-run"), makeLocalRunChart(&runModel_)));
  runLog_ = new QPlainTextEdit(run);
  runLog_->setReadOnly(true);
  runSplit->addWidget(runLog_);
  runSplit->setStretchFactor(0, 3);
  rv->addWidget(runSplit, 1);
  connect(runButton_, &QPushButton::clicked, this, [this] { runLocally(steps_->value()); });
  connect(cancelButton_, &QPushButton::clicked, this, &MainWindow::cancelLocalRun);
  tabs->addTab(run, tr("Run locally"));

  right->addWidget(tabs, 1);
  status_ = new QLabel(central);
  status_->setWordWrap(true);
  right->addWidget(status_);
  h->addLayout(right, 1);
  setCentralWidget(central);
}

QWidget* MainWindow::buildInputs() {
  auto* box = new QGroupBox(tr("What if…"), this);
  box->setFixedWidth(270);
  auto* f = new QFormLayout(box);
  f->setFieldGrowthPolicy(QFormLayout::AllNonFixedFieldsGrow);

  modelCombo_ = new QComboBox(box);
  for (const auto& e : zoo::zoo_entries()) {
    modelCombo_->addItem(qs(e.name), qs(e.name));
    modelCombo_->setItemData(modelCombo_->count() - 1, qs(e.source), Qt::ToolTipRole);
  }
  modelCombo_->insertSeparator(modelCombo_->count());
  modelCombo_->addItem(kOpenItem);
  connect(modelCombo_, &QComboBox::activated, this, &MainWindow::modelChosen);
  f->addRow(tr("Model"), modelCombo_);

  gpuCombo_ = new QComboBox(box);
  for (const auto& d : device_catalog()) {
    gpuCombo_->addItem(qs(d.kind), qs(d.kind));
    gpuCombo_->setItemData(gpuCombo_->count() - 1, qs(d.description), Qt::ToolTipRole);
  }
  f->addRow(tr("GPU"), gpuCombo_);
  auto* clusterRow = new QHBoxLayout;
  clusterLabel_ = new QLabel(tr("(none)"), box);
  clusterButton_ = new QPushButton(tr("Cluster…"), box);
  clusterButton_->setToolTip(tr("Load a cluster description JSON instead of a catalog GPU; cancel to clear it"));
  clusterRow->addWidget(clusterLabel_, 1);
  clusterRow->addWidget(clusterButton_);
  f->addRow(tr("Cluster file"), clusterRow);
  connect(clusterButton_, &QPushButton::clicked, this, &MainWindow::chooseClusterFile);

  nodes_ = new QSpinBox(box);
  nodes_->setRange(1, 4096);
  gpusPerNode_ = new QSpinBox(box);
  gpusPerNode_->setRange(1, 64);
  f->addRow(tr("Nodes"), nodes_);
  f->addRow(tr("GPUs per node"), gpusPerNode_);

  batchMode_ = combo({tr("micro-batch"), tr("global batch")}, box);
  batch_ = new QSpinBox(box);
  batch_->setRange(1, 1 << 24);
  f->addRow(tr("Batch given as"), batchMode_);
  f->addRow(tr("Batch"), batch_);
  gradAccum_ = new QSpinBox(box);
  gradAccum_->setRange(1, 1 << 16);
  gradAccum_->setToolTip(tr("Micro-batches accumulated per step (--grad-accum); a global batch sets it"));
  f->addRow(tr("Grad accumulation"), gradAccum_);
  seqLen_ = new QSpinBox(box);
  seqLen_->setRange(0, 1 << 20);
  seqLen_->setSpecialValueText(tr("model's own"));
  f->addRow(tr("Sequence length"), seqLen_);

  precision_ = combo({tr("default"), QStringLiteral("bf16-mixed"), QStringLiteral("fp16-mixed"), QStringLiteral("fp32")}, box);
  optimizer_ = combo({QStringLiteral("adamw"), QStringLiteral("sgd"), QStringLiteral("sgd-momentum")}, box);
  checkpointing_ = combo({QStringLiteral("none"), QStringLiteral("units")}, box);
  attention_ = combo({QStringLiteral("math"), QStringLiteral("flash")}, box);
  fusion_ = combo({QStringLiteral("engine"), QStringLiteral("eager")}, box);
  fusion_->setObjectName(QStringLiteral("fusion"));
  syncbn_ = combo({QStringLiteral("auto"), QStringLiteral("on"), QStringLiteral("off")}, box);
  QStringList strategies{tr("recommend")};
  for (Strategy s : kAllStrategies) strategies << QString::fromStdString(to_string(s));
  strategy_ = combo(strategies, box);
  f->addRow(tr("Precision"), precision_);
  f->addRow(tr("Optimizer"), optimizer_);
  f->addRow(tr("Checkpointing"), checkpointing_);
  f->addRow(tr("Attention"), attention_);
  f->addRow(tr("Fusion"), fusion_);
  f->addRow(tr("SyncBN"), syncbn_);
  f->addRow(tr("Strategy"), strategy_);
  bucketMb_ = new QDoubleSpinBox(box);
  bucketMb_->setRange(0.25, 1 << 20);
  bucketMb_->setDecimals(2);
  bucketMb_->setSuffix(tr(" MiB"));
  bucketMb_->setToolTip(tr("DDP / ZeRO-1 gradient bucket size (--bucket-mb)"));
  prefetch_ = new QSpinBox(box);
  prefetch_->setRange(0, 1024);
  prefetch_->setToolTip(tr("ZeRO-3 units gathered ahead of the one computing (--prefetch)"));
  lr_ = new QDoubleSpinBox(box);
  lr_->setRange(1e-7, 10);
  lr_->setDecimals(7);
  lr_->setSingleStep(1e-4);
  lr_->setToolTip(tr("Peak learning rate written into a saved plan (--lr)"));
  f->addRow(tr("Bucket"), bucketMb_);
  f->addRow(tr("Prefetch"), prefetch_);
  shardGroup_ = new QSpinBox(box);
  shardGroup_->setRange(0, 1 << 20);
  shardGroup_->setSpecialValueText(tr("one node"));
  shardGroup_->setToolTip(tr("hsdp2 / hsdp3: ranks per shard group, contiguous (--shard-group; 0: one node)"));
  f->addRow(tr("Shard group"), shardGroup_);
  offload_ = combo({QStringLiteral("none"), QStringLiteral("optimizer"), QStringLiteral("params")}, box);
  offload_->setToolTip(tr("CPU offload (--offload): optimizer keeps gradients, optimizer state and its step on the host "
                          "(ZeRO-Offload); params also the parameter shards (zero3, hsdp3)"));
  f->addRow(tr("CPU offload"), offload_);
  freeze_ = new QLineEdit(box);
  freeze_->setPlaceholderText(tr("none"));
  freeze_->setToolTip(tr("Frozen parameters (--freeze): comma-separated globs over node or unit names, e.g. "
                         "wte,wpe,h.0.*; they get no gradients and no optimizer state"));
  f->addRow(tr("Freeze"), freeze_);
  lora_ = new QSpinBox(box);
  lora_->setRange(0, 1 << 20);
  lora_->setSpecialValueText(tr("off"));
  lora_->setToolTip(tr("LoRA adapters of this rank beside the targeted weights (--lora); the base model is frozen"));
  f->addRow(tr("LoRA rank"), lora_);
  loraTargets_ = new QLineEdit(box);
  loraTargets_->setPlaceholderText(QStringLiteral("q,v"));
  loraTargets_->setToolTip(tr("LoRA targets (--lora-targets): globs over linear nodes, and q, k, v, o for attention's "
                              "projections"));
  f->addRow(tr("LoRA targets"), loraTargets_);
  loraAlpha_ = new QDoubleSpinBox(box);
  loraAlpha_->setRange(0, 1e6);
  loraAlpha_->setSpecialValueText(tr("= rank"));
  loraAlpha_->setToolTip(tr("LoRA alpha (--lora-alpha): the adapters' output is scaled by alpha / rank"));
  f->addRow(tr("LoRA alpha"), loraAlpha_);
  for (QLineEdit* e : {freeze_, loraTargets_})
    connect(e, &QLineEdit::editingFinished, this, &MainWindow::inputsEdited);
  f->addRow(tr("Learning rate"), lr_);

  for (QComboBox* c : {gpuCombo_, batchMode_, precision_, optimizer_, checkpointing_, attention_, fusion_, syncbn_, strategy_,
                        offload_})
    connect(c, &QComboBox::currentIndexChanged, this, &MainWindow::inputsEdited);
  for (QSpinBox* s : {nodes_, gpusPerNode_, batch_, gradAccum_, seqLen_, prefetch_, shardGroup_, lora_})
    connect(s, &QSpinBox::valueChanged, this, &MainWindow::inputsEdited);
  for (QDoubleSpinBox* s : {bucketMb_, lr_, loraAlpha_})
    connect(s, &QDoubleSpinBox::valueChanged, this, &MainWindow::inputsEdited);

  auto* save = new QPushButton(tr("Save plan…"), box);
  connect(save, &QPushButton::clicked, this, &MainWindow::savePlanInteractive);
  f->addRow(save);
  return box;
}

QWidget* MainWindow::chartPanel(const QString& name, QWidget* chart) {
  auto* panel = new QWidget;
  auto* g = new QGridLayout(panel);
  g->setContentsMargins(0, 0, 0, 0);
  g->addWidget(chart, 0, 0);
  auto* exp = new QToolButton(panel);
  exp->setText(tr("Export…"));
  exp->setToolTip(tr("Save this chart as PNG or SVG"));
  g->addWidget(exp, 0, 0, Qt::AlignTop | Qt::AlignRight);
  connect(exp, &QToolButton::clicked, this, [this, name] { exportInteractive(name); });
  charts_.insert(name, chart);
  return panel;
}

// ---- inputs -------------------------------------------------------------------

void MainWindow::fillControls(const Inputs& in) {
  filling_ = true;
  const QString model = qs(in.model);
  if (modelCombo_->findData(model) < 0) {
    const int at = modelCombo_->count() - 1;  // before "Open…"
    modelCombo_->insertItem(at, QFileInfo(model).fileName(), model);
    modelCombo_->setItemData(at, model, Qt::ToolTipRole);
  }
  modelCombo_->setCurrentIndex(modelCombo_->findData(model));
  setComboText(gpuCombo_, qs(in.gpu));
  gpuCombo_->setEnabled(in.cluster_file.empty());
  clusterLabel_->setText(in.cluster_file.empty() ? tr("(none)") : QFileInfo(qs(in.cluster_file)).fileName());
  clusterLabel_->setToolTip(qs(in.cluster_file));
  nodes_->setValue(in.nodes);
  gpusPerNode_->setValue(in.gpus_per_node);
  batchMode_->setCurrentIndex(in.use_global_batch ? 1 : 0);
  batch_->setValue(static_cast<int>(in.use_global_batch ? in.global_batch : in.micro_batch));
  gradAccum_->setValue(static_cast<int>(in.grad_accum));
  gradAccum_->setEnabled(!in.use_global_batch);
  seqLen_->setValue(static_cast<int>(in.seq_len));
  bucketMb_->setValue(in.bucket_mb);
  prefetch_->setValue(in.prefetch);
  shardGroup_->setValue(in.shard_group);
  lr_->setValue(in.lr);
  precision_->setCurrentIndex(in.precision.empty() ? 0 : precision_->findText(qs(in.precision)));
  setComboText(optimizer_, qs(in.optimizer));
  setComboText(checkpointing_, qs(in.checkpointing));
  setComboText(attention_, qs(in.attention));
  setComboText(fusion_, qs(in.fusion));
  setComboText(syncbn_, qs(in.syncbn));
  setComboText(offload_, qs(in.offload));
  freeze_->setText(qs(in.freeze));
  lora_->setValue(static_cast<int>(in.lora));
  loraTargets_->setText(qs(in.lora_targets));
  loraAlpha_->setValue(in.lora_alpha);
  strategy_->setCurrentIndex(in.forced ? static_cast<int>(*in.forced) + 1 : 0);
  filling_ = false;
}

void MainWindow::readControls() {
  Inputs& in = inputs_;
  in.model = modelCombo_->currentData().toString().toStdString();
  in.gpu = gpuCombo_->currentData().toString().toStdString();
  in.nodes = nodes_->value();
  in.gpus_per_node = gpusPerNode_->value();
  const bool global = batchMode_->currentIndex() == 1;
  if (global != in.use_global_batch) {  // switching keeps the same samples per step
    filling_ = true;
    batch_->setValue(static_cast<int>(global ? in.micro_batch * in.world() : std::max<int64_t>(1, in.micro_batch)));
    filling_ = false;
  }
  in.use_global_batch = global;
  if (global) in.global_batch = batch_->value();
  else in.micro_batch = batch_->value();
  in.grad_accum = gradAccum_->value();
  gradAccum_->setEnabled(!global);
  in.seq_len = seqLen_->value();
  in.bucket_mb = bucketMb_->value();
  in.prefetch = prefetch_->value();
  in.shard_group = shardGroup_->value();
  in.lr = lr_->value();
  in.precision = precision_->currentIndex() == 0 ? std::string() : precision_->currentText().toStdString();
  in.optimizer = optimizer_->currentText().toStdString();
  in.checkpointing = checkpointing_->currentText().toStdString();
  in.attention = attention_->currentText().toStdString();
  in.fusion = fusion_->currentText().toStdString();
  in.syncbn = syncbn_->currentText().toStdString();
  in.offload = offload_->currentText().toStdString();
  in.freeze = freeze_->text().toStdString();
  in.lora = lora_->value();
  in.lora_targets = loraTargets_->text().toStdString();
  in.lora_alpha = loraAlpha_->value();
  in.forced = strategy_->currentIndex() == 0 ? std::nullopt
                                             : std::optional<Strategy>(kAllStrategies[static_cast<size_t>(strategy_->currentIndex() - 1)]);
}

void MainWindow::inputsEdited() {
  if (filling_) return;
  readControls();
  recompute();
}

void MainWindow::setInputs(const Inputs& in) {
  inputs_ = in;
  fillControls(in);
  recompute();
}

void MainWindow::recompute() {
  status_->setText(tr("computing…"));
  status_->setStyleSheet({});
  recomputer_.request(inputs_);
}

void MainWindow::modelChosen(int index) {
  if (modelCombo_->itemText(index) == kOpenItem) {
    fillControls(inputs_);  // back to the current model until a file loads
    const QString path = QFileDialog::getOpenFileName(this, tr("Open model"), {},
                                                      tr("Models (*.json *.onnx);;All files (*)"));
    if (!path.isEmpty()) openModelFile(path);
    return;
  }
  inputsEdited();
}

void MainWindow::openModelFile(const QString& path) {
  Inputs next = inputs_;
  next.model = path.toStdString();
  next.seq_len = 0;  // the new model's own length
  setInputs(next);
}

void MainWindow::chooseClusterFile() {
  const QString path = QFileDialog::getOpenFileName(this, tr("Cluster description"), {}, tr("JSON (*.json);;All files (*)"));
  Inputs next = inputs_;
  next.cluster_file = path.toStdString();
  try {  // the file's topology, as `dlplan plan --cluster FILE` keeps it
    if (!path.isEmpty())
      if (auto shape = cluster_file_topology(next.cluster_file)) std::tie(next.nodes, next.gpus_per_node) = *shape;
  } catch (const std::exception& e) {
    showError(QString::fromStdString(e.what()));
    return;
  }
  setInputs(next);
}

// ---- results ------------------------------------------------------------------

void MainWindow::showResults(quint64 generation) {
  auto r = recomputer_.results();
  if (!r) return;
  lastGood_ = r->inputs;
  haveGood_ = true;
  filling_ = true;
  strategyModel_.setResults(r);
  filling_ = false;
  seqLen_->setEnabled(r->tokens_per_sample > 0);
  fusion_->setEnabled(r->imported);
  fusion_->setToolTip(r->imported ? tr("engine: the file planned as dlplan's engine fuses it; eager: the math its Python "
                                       "writes out planned op by op, keeping what PyTorch's eager autograd keeps (--fusion)")
                                  : tr("--fusion applies to the files dlplan imports (ONNX, a Hugging Face config.json)"));
  seqLen_->setToolTip(r->tokens_per_sample > 0 ? tr("tokens per sample: %1").arg(r->tokens_per_sample)
                                               : tr("this model takes no token inputs"));
  updateSelection();

  const auto& p = r->planning;
  const auto& req = p.request;
  const auto& t = req.training;
  const int64_t tokens = tokens_per_sample(req.model);
  QString html = tr("<b>%1</b> (%2 parameters) on %3 × %4 (%5 node%6 × %7), %8 per GPU; global batch %9 = %10 × %11 × %3")
                     .arg(qs(req.model.name).toHtmlEscaped(), qs(format_count(req.model.parameter_count())))
                     .arg(req.cluster.world()).arg(qs(req.cluster.device.kind)).arg(req.cluster.nodes)
                     .arg(req.cluster.nodes == 1 ? QString() : QStringLiteral("s")).arg(req.cluster.gpus_per_node)
                     .arg(qs(format_bytes(static_cast<double>(r->capacity_bytes))))
                     .arg(t.micro_batch * t.grad_accum * req.cluster.world()).arg(t.micro_batch).arg(t.grad_accum);
  if (tokens > 0) html += tr("; seq-len %1").arg(tokens) + (tokens == req.model_context ? tr(" (the model's context)") : QString());
  html += tr("; %1, %2 lr %3, bucket %4 MiB, prefetch %5%6<br>")
              .arg(qs(to_string(t.precision)), qs(to_string(t.optimizer.kind)))
              .arg(t.optimizer.lr)
              .arg(t.bucket_mb)
              .arg(t.prefetch)
              .arg(r->imported ? tr(", fusion %1").arg(qs(r->inputs.fusion)) : QString());
  if (t.fine_tuning.active())
    html += tr("Fine-tuning: %1<br>").arg(qs(describe(t.fine_tuning, req.model)).toHtmlEscaped());
  html += recommendationText().toHtmlEscaped().replace(QLatin1Char('\n'), QStringLiteral("<br>"));
  for (const auto& note : req.model.notes) html += QStringLiteral("<br><i>note: %1</i>").arg(qs(note).toHtmlEscaped());
  advice_->setHtml(html);
  status_->setStyleSheet({});
  status_->setText(tr("plan %1 ms, simulation %2 ms").arg(r->plan_ms, 0, 'f', 1).arg(r->simulate_ms, 0, 'f', 1));
  emit resultsShown(generation);
}

QString MainWindow::recommendationText() const {
  const Results* r = strategyModel_.results();
  if (!r) return {};
  QStringList lines;  // the planner's sentences, as the CLI prints them
  for (const auto& line : recommendation_lines(r->planning)) lines << qs(line);
  while (!lines.isEmpty() && lines.back().isEmpty()) lines.removeLast();
  return lines.join(QLatin1Char('\n'));
}

void MainWindow::selectStrategyRow(int row) {
  const Results* r = strategyModel_.results();
  if (!r || row < 0 || row >= static_cast<int>(r->planning.results.size())) return;
  selectedStrategy_ = r->planning.results[static_cast<size_t>(row)].strategy;
  selectedRow_ = row;
  if (inputs_.show == selectedStrategy_) return;
  inputs_.show = selectedStrategy_;  // the timeline, Gantt and tensors of that row: a recompute
  recompute();
}

void MainWindow::updateSelection() {
  auto r = recomputer_.results();
  if (!r) return;
  const int row = r->shown;
  selectedRow_ = row;
  filling_ = true;
  table_->selectRow(row);
  filling_ = false;
  timelineModel_.setSimulation(r);
  gantt_->setSimulation(r);
  tensorModel_.setResults(r);
}

void MainWindow::showSweep(quint64 generation) {
  sweepModel_.setSweep(recomputer_.sweep());
  emit sweepShown(generation);
}

void MainWindow::showFailure(quint64, const QString& message, const Inputs& failed) {
  if (!haveGood_ || failed.model != lastGood_.model || failed.cluster_file != lastGood_.cluster_file) {
    // A model (or cluster) file that does not load: the dialog, and back to
    // the previous one; the table and charts still show its results.
    showError(message);
    if (haveGood_) {
      Inputs back = inputs_;
      back.model = lastGood_.model;
      back.seq_len = lastGood_.seq_len;
      back.cluster_file = lastGood_.cluster_file;
      inputs_ = back;
      fillControls(inputs_);
      if (!(inputs_ == lastGood_)) recompute();
    }
  }
  status_->setStyleSheet(QStringLiteral("color: #b00020"));
  status_->setText(tr("Not recomputed: %1").arg(message) + (haveGood_ ? tr(" — showing the last valid inputs") : QString()));
}

void MainWindow::showError(const QString& text) {
  emit errorShown(text);
  if (!interactiveErrors_) return;
  auto* box = new QMessageBox(QMessageBox::Critical, tr("dlplan"), text, QMessageBox::Ok, this);
  box->setAttribute(Qt::WA_DeleteOnClose);
  box->open();
}

// ---- actions ------------------------------------------------------------------

bool MainWindow::savePlan(const QString& path) {
  const Results* r = strategyModel_.results();
  if (!r || selectedRow_ < 0) return false;
  const std::string text = plan_json(r->planning, r->planning.results[static_cast<size_t>(selectedRow_)]).dump(1) + "\n";
  QSaveFile f(path);
  if (!f.open(QIODevice::WriteOnly)) return false;
  f.write(text.data(), static_cast<qint64>(text.size()));
  return f.commit();
}

void MainWindow::savePlanInteractive() {
  const QString path = QFileDialog::getSaveFileName(this, tr("Save plan"), QStringLiteral("plan.json"), tr("JSON (*.json)"));
  if (!path.isEmpty() && !savePlan(path)) showError(tr("%1: cannot write the plan").arg(path));
}

bool MainWindow::exportChart(const QString& name, const QString& path) { return exportWidget(charts_.value(name), path, name); }

void MainWindow::exportInteractive(const QString& name) {
  QString filter;
  const QString path = QFileDialog::getSaveFileName(this, tr("Export chart"), name + QStringLiteral(".png"),
                                                    tr("PNG image (*.png);;SVG drawing (*.svg)"), &filter);
  if (path.isEmpty()) return;
  if (!exportChart(name, path)) showError(tr("%1: cannot export the chart").arg(path));
}

bool MainWindow::runLocally(int steps) {
  const Results* r = strategyModel_.results();
  if (!r || selectedRow_ < 0) return false;
  const Strategy s = r->planning.results[static_cast<size_t>(selectedRow_)].strategy;
  Engine::LocalPlan lp;
  try {
    lp = recomputer_.engine().local_plan(r->inputs, s, 2);
  } catch (const std::exception& e) {
    showError(tr("Run locally: %1").arg(qs(e.what())));
    return false;
  }
  runModel_.reset(lp.predicted_peak);
  runLog_->clear();
  runStatus_->setText(tr("starting %1 on 2 cpu ranks…").arg(qs(to_string(s))));
  if (!localRun_.start(qs(lp.json), 2, steps)) return false;
  runLog_->appendPlainText(tr("plan: %1").arg(localRun_.planPath()));
  runButton_->setEnabled(false);
  cancelButton_->setEnabled(true);
  return true;
}

void MainWindow::cancelLocalRun() { localRun_.cancel(); }

}  // namespace dlplan::gui
