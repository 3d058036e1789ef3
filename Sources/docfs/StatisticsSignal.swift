import DocumentEngine
import Foundation
import Logging
import Synchronization

#if canImport(Glibc)
    import Glibc
#endif

/// The write end of the pipe that the SIGUSR1 handler writes to; -1 until installed. An atomic,
/// which a signal handler may load: it is lock-free.
private let statisticsSignalPipe = Atomic<Int32>(-1)

/// `kill -USR1 <daemon>` makes a mount's daemon log its store's statistics (content chunks and
/// bytes read and written since it started) at notice level, in its log.
///
/// This is how one sees from outside that listing a mount reads no content (scripts/bench.sh
/// checks it) without a side channel in the mounted tree itself.
enum StatisticsSignal {
    static func install(store: any DocumentStore, logger: Logger) {
        var fds: [Int32] = [-1, -1]
        guard pipe(&fds) == 0 else {
            logger.warning("cannot log statistics on SIGUSR1: pipe: \(errnoText())")
            return
        }
        for fd in fds { _ = fcntl(fd, F_SETFD, FD_CLOEXEC) }
        // The handler must never block: when the pipe is full the byte is dropped, and one
        // line answers many signals as well as one.
        _ = fcntl(fds[1], F_SETFL, O_NONBLOCK)
        statisticsSignalPipe.store(fds[1], ordering: .releasing)
        let reader = fds[0]
        // A signal handler may only make async-signal-safe calls: it writes a byte, and this
        // thread does the logging.
        Thread.detachNewThread {
            var byte: UInt8 = 0
            while true {
                let n = read(reader, &byte, 1)
                if n < 0 && errno == EINTR { continue }
                guard n > 0 else { return }
                let s = store.statistics
                logger.notice(
                    "store statistics: chunksRead=\(s.chunksRead) bytesRead=\(s.bytesRead) chunksWritten=\(s.chunksWritten) bytesWritten=\(s.bytesWritten) nodesWritten=\(s.nodesWritten) bytesPrepared=\(s.bytesPrepared)"
                )
            }
        }
        var action = sigaction()
        action.__sigaction_handler.sa_handler = { _ in
            let saved = errno
            var byte: UInt8 = 1
            _ = write(statisticsSignalPipe.load(ordering: .acquiring), &byte, 1)
            errno = saved
        }
        action.sa_flags = SA_RESTART
        sigemptyset(&action.sa_mask)
        sigaction(SIGUSR1, &action, nil)
    }
}
