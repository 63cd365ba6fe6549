#include "local_run.hpp"

#include "dlplan/plan_io.hpp"

#include <QCoreApplication>
#include <QDir>
#include <QFile>
#include <QFileInfo>
#include <QProcessEnvironment>
#include <QStandardPaths>

#include <csignal>
#include <sys/types.h>
#include <unistd.h>

namespace dlplan::gui {

LocalRun::LocalRun(QObject* parent) : QObject(parent), dlplan_(defaultDlplan()), mpirun_(defaultMpirun()) {
  killTimer_.setSingleShot(true);
  connect(&killTimer_, &QTimer::timeout, this, [this] {
    if (pgid_ > 0) ::kill(static_cast<pid_t>(-pgid_), SIGKILL);
  });
}

LocalRun::~LocalRun() {
  if (running()) {
    proc_->disconnect(this);
    if (pgid_ > 0) ::kill(static_cast<pid_t>(-pgid_), SIGKILL);
    proc_->waitForFinished(3000);
  }
}

QString LocalRun::defaultDlplan() {
  const QString env = qEnvironmentVariable("DLPLAN_EXE");
  if (!env.isEmpty() && QFileInfo(env).isExecutable()) return env;
  const QString next = QDir(QCoreApplication::applicationDirPath()).filePath(QStringLiteral("dlplan"));
  return QFileInfo(next).isExecutable() ? next : QString();
}

QString LocalRun::defaultMpirun() {
  QString p = QStandardPaths::findExecutable(QStringLiteral("mpirun"));
  if (p.isEmpty()) p = QStandardPaths::findExecutable(QStringLiteral("mpiexec"));
  return p;
}

bool LocalRun::start(const QString& planJson, int ranks, int steps) {
  if (running()) {
    emit finished(false, tr("a local run is already running"));
    return false;
  }
  if (mpirun_.isEmpty()) {
    emit finished(false, tr("mpirun not found on PATH (install openmpi-bin)"));
    return false;
  }
  if (dlplan_.isEmpty()) {
    emit finished(false, tr("the dlplan executable was not found next to dlplan-gui (%1)").arg(QCoreApplication::applicationDirPath()));
    return false;
  }
  dir_ = std::make_unique<QTemporaryDir>();
  planPath_ = dir_->filePath(QStringLiteral("plan.json"));
  QFile f(planPath_);
  if (!dir_->isValid() || !f.open(QIODevice::WriteOnly) || f.write(planJson.toUtf8()) < 0) {
    emit finished(false, tr("cannot write the plan to %1").arg(planPath_));
    return false;
  }
  f.close();

  delete proc_;
  proc_ = new QProcess(this);
  auto env = QProcessEnvironment::systemEnvironment();
  env.insert(QStringLiteral("OMPI_ALLOW_RUN_AS_ROOT"), QStringLiteral("1"));
  env.insert(QStringLiteral("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM"), QStringLiteral("1"));
  env.insert(QStringLiteral("OPENBLAS_NUM_THREADS"), QStringLiteral("1"));
  proc_->setProcessEnvironment(env);
  // Its own process group, so that cancel() reaches mpirun and every rank.
  proc_->setChildProcessModifier([] { ::setpgid(0, 0); });
  connect(proc_, &QProcess::readyReadStandardOutput, this, &LocalRun::readStdout);
  connect(proc_, &QProcess::readyReadStandardError, this, [this] {
    const auto lines = QString::fromUtf8(proc_->readAllStandardError()).split(QLatin1Char('\n'), Qt::SkipEmptyParts);
    for (const auto& l : lines) {
      lastError_ = l;
      emit outputLine(l);
    }
  });
  connect(proc_, &QProcess::finished, this, &LocalRun::processFinished);
  connect(proc_, &QProcess::errorOccurred, this, [this](QProcess::ProcessError e) {
    if (e == QProcess::FailedToStart) emit finished(false, tr("cannot start %1: %2").arg(mpirun_, proc_->errorString()));
  });
  cancelled_ = false;
  buffer_.clear();
  lastError_.clear();
  const QStringList args = {QStringLiteral("-np"), QString::number(ranks), QStringLiteral("--oversubscribe"), dlplan_,
                            QStringLiteral("train"), QStringLiteral("--plan"), planPath_, QStringLiteral("--steps"),
                            QString::number(steps), QStringLiteral("--progress"), QStringLiteral("json")};
  proc_->start(mpirun_, args);
  if (!proc_->waitForStarted(10000)) return false;
  pgid_ = proc_->processId();
  return true;
}

void LocalRun::readStdout() {
  buffer_ += proc_->readAllStandardOutput();
  int nl;
  while ((nl = buffer_.indexOf('\n')) >= 0) {
    const QByteArray line = buffer_.left(nl).trimmed();
    buffer_.remove(0, nl + 1);
    if (line.isEmpty()) continue;
    const auto p = progress_line_from_json(std::string_view(line.constData(), static_cast<size_t>(line.size())));
    if (!p) {  // not a progress line (the planner's document library checks every field)
      emit outputLine(QString::fromUtf8(line));
      continue;
    }
    emit progress(static_cast<int>(p->step), static_cast<int>(p->steps), p->loss, static_cast<qint64>(p->peak_bytes),
                  p->step_seconds);
  }
}

void LocalRun::cancel() {
  if (!running() || pgid_ <= 0) return;
  cancelled_ = true;
  ::kill(static_cast<pid_t>(-pgid_), SIGTERM);
  killTimer_.start(graceMs_);
}

QList<qint64> LocalRun::groupMembers(qint64 pgid) {
  QList<qint64> out;
  if (pgid <= 0) return out;
  const QStringList entries = QDir(QStringLiteral("/proc")).entryList(QDir::Dirs | QDir::NoDotAndDotDot);
  for (const QString& e : entries) {
    bool ok = false;
    const qint64 pid = e.toLongLong(&ok);
    if (!ok) continue;
    QFile stat(QStringLiteral("/proc/%1/stat").arg(e));
    if (!stat.open(QIODevice::ReadOnly)) continue;
    const QByteArray s = stat.readAll();
    const int close = s.lastIndexOf(')');  // comm may hold spaces
    if (close < 0) continue;
    const QList<QByteArray> f = s.mid(close + 2).split(' ');  // state ppid pgrp ...
    if (f.size() < 3) continue;
    if (f[0] == "Z" || f[0] == "X") continue;
    if (f[2].toLongLong() == pgid) out.push_back(pid);
  }
  return out;
}

void LocalRun::reapGroup() {
  // mpirun is gone; a rank that outlived it (it should not) is killed here.
  for (int i = 0; i < 50 && !groupMembers(pgid_).isEmpty(); ++i) {
    ::kill(static_cast<pid_t>(-pgid_), i == 0 && !cancelled_ ? SIGTERM : SIGKILL);
    ::usleep(20000);
  }
}

void LocalRun::processFinished(int code, QProcess::ExitStatus status) {
  killTimer_.stop();
  readStdout();
  reapGroup();
  const bool ok = !cancelled_ && status == QProcess::NormalExit && code == 0;
  QString msg;
  if (cancelled_) msg = tr("cancelled");
  else if (ok) msg = tr("finished");
  else msg = tr("mpirun exited with code %1%2").arg(code).arg(lastError_.isEmpty() ? QString() : QStringLiteral(": ") + lastError_);
  emit finished(ok, msg);
}

}  // namespace dlplan::gui
