#include "recomputer.hpp"

#include <QtConcurrent/QtConcurrentRun>

#include <exception>

namespace dlplan::gui {

Recomputer::Recomputer(QObject* parent) : QObject(parent) {
  connect(&watcher_, &QFutureWatcherBase::finished, this, &Recomputer::finished);
}

Recomputer::~Recomputer() {
  pending_.reset();
  watcher_.disconnect();
  watcher_.waitForFinished();
}

quint64 Recomputer::request(const Inputs& in) {
  pending_ = Job{in, ++generation_, false};
  if (!running_) startNext();
  return generation_;
}

void Recomputer::startNext() {
  if (!pending_) {
    emit idle();
    return;
  }
  current_ = *pending_;
  pending_.reset();
  running_ = true;
  auto engine = engine_;  // shared: the job may outlive nothing, but never dangles
  const Job job = current_;
  watcher_.setFuture(QtConcurrent::run([engine, job]() -> Outcome {
    try {
      if (job.sweep) return std::make_shared<const Sweep>(engine->sweep(job.inputs));
      return std::make_shared<const Results>(engine->compute(job.inputs));
    } catch (const std::exception& e) {
      return std::string(e.what());
    }
  }));
}

void Recomputer::finished() {
  running_ = false;
  const Outcome out = watcher_.result();
  const Job job = current_;
  const bool latest = job.generation == generation_;
  if (latest) {
    if (const auto* r = std::get_if<std::shared_ptr<const Results>>(&out)) {
      results_ = *r;
      emit resultsReady(job.generation);
      if (sweepEnabled_ && !pending_) pending_ = Job{job.inputs, job.generation, true};
    } else if (const auto* s = std::get_if<std::shared_ptr<const Sweep>>(&out)) {
      sweep_ = *s;
      emit sweepReady(job.generation);
    } else if (!job.sweep) {
      emit failed(job.generation, QString::fromStdString(std::get<std::string>(out)), job.inputs);
    }
  }
  startNext();
}

}  // namespace dlplan::gui
