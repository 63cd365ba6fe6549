// "Run locally": `mpirun -np R --oversubscribe dlplan train --plan FILE
// --steps K --progress json` as a child process group, its JSON progress
// lines parsed into progress() signals. cancel() sends SIGTERM to the whole
// group (mpirun forwards it to the ranks), then SIGKILL after a grace period,
// and checks through /proc that nothing of the group is left.
#pragma once

#include <QObject>
#include <QProcess>
#include <QString>
#include <QTemporaryDir>
#include <QTimer>

#include <memory>

namespace dlplan::gui {

class LocalRun : public QObject {
  Q_OBJECT

 public:
  explicit LocalRun(QObject* parent = nullptr);
  ~LocalRun() override;

  // The dlplan executable next to this program (or DLPLAN_EXE from the
  // environment), and mpirun from PATH; empty when not found.
  static QString defaultDlplan();
  static QString defaultMpirun();
  void setDlplan(const QString& path) { dlplan_ = path; }
  void setMpirun(const QString& path) { mpirun_ = path; }
  void setGraceMs(int ms) { graceMs_ = ms; }

  // Writes `planJson` to a temporary file and starts the job. False (and
  // finished(false, why)) when it cannot start.
  bool start(const QString& planJson, int ranks, int steps);
  void cancel();
  bool running() const { return proc_ && proc_->state() != QProcess::NotRunning; }
  QString planPath() const { return planPath_; }
  qint64 processGroup() const { return pgid_; }
  // Live (non-zombie) processes whose process group is `pgid`, from /proc.
  static QList<qint64> groupMembers(qint64 pgid);

 signals:
  void progress(int step, int steps, double loss, qint64 peakBytes, double stepSeconds);
  void outputLine(const QString& line);
  void finished(bool ok, const QString& message);

 private:
  void readStdout();
  void processFinished(int code, QProcess::ExitStatus status);
  void reapGroup();

  QString dlplan_, mpirun_, planPath_;
  std::unique_ptr<QTemporaryDir> dir_;
  QProcess* proc_ = nullptr;
  QTimer killTimer_;
  qint64 pgid_ = 0;
  int graceMs_ = 3000;
  bool cancelled_ = false;
  QByteArray buffer_;
  QString lastError_;
};

}  // namespace dlplan::gui
