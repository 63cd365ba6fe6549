// dlplan-gui's command line before any window: --help and --version answer
// without a display (no X server, no Wayland, no QT_QPA_PLATFORM), and a bad
// flag or value is a usage error (exit 2) naming it, as in dlplan.
#include <QProcess>
#include <QProcessEnvironment>
#include <QtTest>

namespace {

struct Run {
  int exitCode = -1;
  bool crashed = true;
  QString out, err;
};

// Runs dlplan-gui with no display at all.
Run runHeadless(const QStringList& args) {
  QProcessEnvironment env = QProcessEnvironment::systemEnvironment();
  for (const char* v : {"DISPLAY", "WAYLAND_DISPLAY", "QT_QPA_PLATFORM"}) env.remove(QString::fromLatin1(v));
  QProcess p;
  p.setProcessEnvironment(env);
  p.start(QStringLiteral(DLPLAN_GUI_EXE), args);
  Run r;
  if (!p.waitForFinished(60000)) {
    p.kill();
    p.waitForFinished();
    return r;
  }
  r.crashed = p.exitStatus() != QProcess::NormalExit;
  r.exitCode = p.exitCode();
  r.out = QString::fromUtf8(p.readAllStandardOutput());
  r.err = QString::fromUtf8(p.readAllStandardError());
  return r;
}

}  // namespace

class StartupTest : public QObject {
  Q_OBJECT

 private slots:
  void helpWithoutADisplay() {
    const Run r = runHeadless({QStringLiteral("--help")});
    QVERIFY2(!r.crashed, qPrintable(r.err));
    QCOMPARE(r.exitCode, 0);
    QVERIFY2(r.out.contains(QStringLiteral("Usage: ")), qPrintable(r.out));
    for (const char* flag : {"--model", "--grad-accum", "--bucket-mb", "--prefetch", "--lr", "--fusion"})
      QVERIFY2(r.out.contains(QString::fromLatin1(flag)), flag);
  }

  void versionWithoutADisplay() {
    const Run r = runHeadless({QStringLiteral("--version")});
    QVERIFY2(!r.crashed, qPrintable(r.err));
    QCOMPARE(r.exitCode, 0);
    QVERIFY2(r.out.contains(QStringLiteral("dlplan-gui 0.1.0")), qPrintable(r.out));
  }

  void badFlagsAreUsageErrors_data() {
    QTest::addColumn<QStringList>("args");
    QTest::addColumn<QString>("named");
    QTest::newRow("unknown flag") << QStringList{QStringLiteral("--no-such-flag")} << QStringLiteral("no-such-flag");
    QTest::newRow("zero GPUs") << QStringList{QStringLiteral("--gpus"), QStringLiteral("0")} << QStringLiteral("--gpus");
    QTest::newRow("negative lr") << QStringList{QStringLiteral("--model"), QStringLiteral("tiny-gpt"), QStringLiteral("--lr"),
                                                QStringLiteral("-1")}
                                 << QStringLiteral("--lr");
    QTest::newRow("bad strategy") << QStringList{QStringLiteral("--strategy"), QStringLiteral("zero9")}
                                  << QStringLiteral("zero9");
    QTest::newRow("fusion of a zoo model") << QStringList{QStringLiteral("--model"), QStringLiteral("gpt2"),
                                                          QStringLiteral("--fusion"), QStringLiteral("eager")}
                                           << QStringLiteral("--fusion");
    QTest::newRow("bad fusion") << QStringList{QStringLiteral("--model"),
                                               QStringLiteral(DLPLAN_SOURCE_DIR "/tests/fixtures/hf/tiny-gemma.json"),
                                               QStringLiteral("--fusion"), QStringLiteral("lazy")}
                                << QStringLiteral("lazy");
  }

  void badFlagsAreUsageErrors() {
    QFETCH(QStringList, args);
    QFETCH(QString, named);
    const Run r = runHeadless(args);
    QVERIFY2(!r.crashed, qPrintable(r.err));
    QCOMPARE(r.exitCode, 2);
    QVERIFY2(r.err.startsWith(QStringLiteral("dlplan-gui: error: ")), qPrintable(r.err));
    QVERIFY2(r.err.contains(named), qPrintable(r.err));
  }
};

QTEST_GUILESS_MAIN(StartupTest)
#include "startup_test.moc"
