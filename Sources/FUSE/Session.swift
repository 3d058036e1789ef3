import CFuse3
import Logging
import Synchronization
import SystemPackage
import Threading

#if canImport(Glibc)
    import Glibc
#elseif canImport(Musl)
    import Musl
#endif

/// How to mount and serve a filesystem.
public struct MountOptions: Sendable {
    /// The source shown in `/proc/mounts` (`fsname=`).
    public var fsName: String?
    /// The type suffix shown as `fuse.<subtype>` (`subtype=`).
    public var subtype: String?
    /// Let the kernel check permissions from the reported modes (`default_permissions`).
    public var defaultPermissions = true
    /// Let other users in (`allow_other`; non-root needs `user_allow_other` in /etc/fuse.conf).
    public var allowOther = false
    /// Mount read-only (`ro`).
    public var readOnly = false
    /// Further `-o` options, passed as written (e.g. `"max_read=131072"`).
    public var options: [String] = []
    /// Most worker threads the session may start (one more whenever none is idle).
    public var maxThreads = 10
    /// Unmount on SIGINT, SIGTERM and SIGHUP (and ignore SIGPIPE). Only signals still at their
    /// default disposition are taken, and only one session in a process can own them: leave
    /// it off in tests and libraries, turn it on in a daemon.
    public var handleSignals = false
    /// How long the end of a session waits for replies still pending before the connection is
    /// aborted (their callers then see `ECONNABORTED`).
    public var drainTimeout: Duration = .seconds(5)
    /// libfuse's request trace on stderr (`-d`).
    public var debug = false
    /// Name of the session's threads (at most 15 bytes); libfuse's workers inherit it.
    public var threadName = "fuse-worker"

    public init() {}

    var arguments: [String] {
        func escape(_ s: String) -> String {
            s.replacingAll("\\", with: "\\\\").replacingAll(",", with: "\\,")
        }
        var mountOptions: [String] = []
        if let fsName { mountOptions.append("fsname=" + escape(fsName)) }
        if let subtype { mountOptions.append("subtype=" + escape(subtype)) }
        if defaultPermissions { mountOptions.append("default_permissions") }
        if allowOther { mountOptions.append("allow_other") }
        if readOnly { mountOptions.append("ro") }
        mountOptions += options
        var arguments = ["docfs-fuse"]
        if !mountOptions.isEmpty { arguments += ["-o", mountOptions.joined(separator: ",")] }
        if debug { arguments.append("-d") }
        return arguments
    }
}

extension String {
    fileprivate func replacingAll(_ target: Character, with replacement: String) -> String {
        var result = ""
        for c in self {
            if c == target { result += replacement } else { result.append(c) }
        }
        return result
    }
}

/// Why a session could not be set up or ended badly.
public enum FUSEError: Error, Hashable, Sendable {
    /// The mountpoint is missing or not a directory.
    case invalidMountpoint(String, Errno)
    /// libfuse refused the options (details on stderr).
    case sessionCreationFailed(arguments: [String])
    /// The mount failed (details on stderr).
    case mountFailed(String)
    /// `start()`/`run()` called on a session that already ran.
    case alreadyStarted
    /// A thread could not be created.
    case threadCreationFailed
    /// `fuse_daemonize` failed.
    case daemonizeFailed
    /// The loop ended with an error (a negative errno, or the number of the signal).
    case loopFailed(Int32)
}

/// A mounted filesystem and the libfuse session serving it.
///
/// ```swift
/// let session = try Session(filesystem: fs, mountpoint: "/mnt/x", options: options)
/// try session.start()          // serve on a background thread
/// ...
/// session.unmount()            // stop, run destroy, unmount, wait
/// ```
/// or `try session.run()` to serve in the foreground until unmounted (`fusermount3 -u`, a
/// signal with ``MountOptions/handleSignals``, or ``requestUnmount()``).
///
/// The end of a session, whatever starts it: the loop stops reading requests, pending replies
/// get up to ``MountOptions/drainTimeout``, the mount is removed (lazily if it is busy) and its
/// connection aborted (a request still waiting fails with `ECONNABORTED`, a later one with
/// `ENOTCONN`), then the
/// filesystem's ``FileSystem/destroy()`` runs and libfuse's session is freed.
public final class Session: Sendable {
    private enum Phase: Equatable {
        case mounted, running, stopping, finished
    }
    private struct Lifecycle {
        var phase = Phase.mounted
        var loopThread: pthread_t?
        var joined = false
        var result: Result<Void, FUSEError>?
        var waiters: [@Sendable (Result<Void, FUSEError>) -> Void] = []
    }

    /// Where the filesystem is mounted.
    public let mountpoint: String
    /// The kernel's connection number (the minor of the mount's device), for fusectl.
    private let connection = Mutex<(major: UInt32, minor: UInt32)?>(nil)
    /// Sends cache notifications to the kernel for this mount.
    public let notifier: Notifier
    private let core: SessionCore
    private let lifecycle = Monitor(Lifecycle())
    private let signals = Mutex<SignalHandling?>(nil)
    /// The workers, once serving.
    private let requestLoop = Mutex<RequestLoop?>(nil)

    /// Creates a libfuse session for `filesystem` and mounts it at `mountpoint`. Requests
    /// are served only once ``start()`` or ``run()`` is called; until then accesses to the
    /// mount wait.
    public init(
        filesystem: some FileSystem, mountpoint: String, options: MountOptions = MountOptions(),
        logger: Logger = Logger(label: "fuse")
    ) throws(FUSEError) {
        var st = stat()
        if stat(mountpoint, &st) != 0 {
            throw .invalidMountpoint(mountpoint, Errno(rawValue: errno))
        }
        guard st.st_mode & Glibc.S_IFMT == Glibc.S_IFDIR else {
            throw .invalidMountpoint(mountpoint, .notDirectory)
        }
        self.mountpoint = mountpoint
        core = SessionCore(filesystem: filesystem, options: options, logger: logger)
        notifier = Notifier(core: core)
        // libfuse holds the core for the session's lifetime; released in teardown.
        let userdata = Unmanaged.passRetained(core).toOpaque()

        let arguments = options.arguments
        var cArguments: [UnsafeMutablePointer<CChar>?] = arguments.map { strdup($0) } + [nil]
        defer { for p in cArguments { free(p) } }
        var ops = makeOperations()
        let se = cArguments.withUnsafeMutableBufferPointer { argv in
            var args = fuse_args(argc: Int32(arguments.count), argv: argv.baseAddress, allocated: 0)
            defer { fuse_opt_free_args(&args) }
            return fuse_session_new(&args, &ops, MemoryLayout<fuse_lowlevel_ops>.size, userdata)
        }
        guard let se else {
            Unmanaged.passUnretained(core).release()
            // Nothing to take down: deinit must not run teardown (it would release the core again).
            lifecycle.withLock { $0.phase = .finished }
            throw .sessionCreationFailed(arguments: arguments)
        }
        core.session = se
        guard fuse_session_mount(se, mountpoint) == 0 else {
            fuse_session_destroy(se)
            core.session = nil
            Unmanaged.passUnretained(core).release()
            lifecycle.withLock { $0.phase = .finished }
            throw .mountFailed(mountpoint)
        }
        // A child spawned by this process must not keep the connection alive after the server
        // has gone (see `abortConnection`).
        let deviceFD = fuse_session_fd(se)
        if deviceFD >= 0 { _ = fcntl(deviceFD, F_SETFD, fcntl(deviceFD, F_GETFD) | FD_CLOEXEC) }
        // The same descriptor, read and written through hooks that see the raw protocol.
        // Without them the mount works as before, minus what ``RawProtocol`` adds.
        let hooked = withUnsafePointer(to: RawProtocol.io) { fuse_session_custom_io(se, $0, deviceFD) }
        if hooked != 0 { logger.warning("cannot hook the FUSE device's I/O: \(Errno(rawValue: -hooked))") }
        var major: UInt32 = 0
        var minor: UInt32 = 0
        if docfs_mount_device(mountpoint, &major, &minor) == 0 {
            connection.withLock { $0 = (major, minor) }
        }
        logger.debug("mounted", metadata: ["mountpoint": "\(mountpoint)"])
    }

    /// Fails every request still waiting on this mount's connection. libfuse's workers drop
    /// requests they read after the loop was told to exit, and a process that inherited the
    /// /dev/fuse descriptor across fork (a child being spawned closes its descriptors one by
    /// one, and a FLUSH from that close waits for an answer) keeps the connection alive after
    /// the server closed its own: without this, such a request, and the child, wait forever.
    private func abortConnection(pinned: Int32) {
        guard let (major, minor) = connection.withLock({ $0 }) else {
            if pinned >= 0 { close(pinned) }
            return
        }
        let directory = "/sys/fs/fuse/connections"
        if access(directory + "/\(minor)", F_OK) != 0, getuid() == 0 {
            _ = Glibc.mount("fusectl", directory, "fusectl", 0, nil)
        }
        _ = docfs_abort_pinned_connection(pinned, major, minor)
    }

    /// Aborts this session's connection by its number if it is still connected after the
    /// unmount: the mount was detached lazily with files open, so the mount point no longer leads
    /// to it. A connection that is still connected still has its file system (the kernel ends
    /// the connection when it drops the file system), so its number cannot have passed to
    /// another mount.
    ///
    /// `device` is a descriptor of the connection's device to ask (the unmount closes the
    /// session's own); -1 when there is none, and then the caller must know the connection is up.
    private func abortStillServedConnection(device: Int32) {
        guard device < 0 || Self.isConnected(device), let (_, minor) = connection.withLock({ $0 }),
            docfs_abort_connection(minor) == 1
        else { return }
        core.logger.notice("the mount was detached with files still open: its connection was aborted")
    }

    /// Whether the kernel still has the connection of `device` up: `poll` reports `POLLERR`
    /// once the connection has ended or been aborted.
    private static func isConnected(_ device: Int32) -> Bool {
        var entry = pollfd(fd: device, events: Int16(POLLIN), revents: 0)
        guard poll(&entry, 1, 0) >= 0 else { return false }
        return entry.revents & Int16(POLLERR | POLLNVAL) == 0
    }

    deinit {
        let (phase, thread, joined) = lifecycle.withLock { ($0.phase, $0.loopThread, $0.joined) }
        if phase == .mounted {
            // Never served: take it down here so no mount outlives the object.
            teardown(loopResult: 0)
        } else if let thread, !joined {
            // The last reference can go on the loop thread itself, which cannot join itself.
            pthread_detach(thread)
        }
    }

    /// Detaches from the terminal and runs in the background (`fuse_daemonize`): forks, so
    /// call it after mounting and before ``start()`` or ``run()`` (before any other thread).
    public func daemonize() throws(FUSEError) {
        guard fuse_daemonize(0) == 0 else { throw .daemonizeFailed }
    }

    /// Starts serving on a background thread and returns. End it with ``unmount()``.
    public func start() throws(FUSEError) {
        let admitted = lifecycle.withLock { state in
            guard state.phase == .mounted else { return false }
            state.phase = .running
            return true
        }
        guard admitted, let se = core.session else { throw .alreadyStarted }
        guard core.notifications.start(session: se, threadName: core.options.threadName) else {
            lifecycle.withLock { $0.phase = .mounted }
            throw .threadCreationFailed
        }
        if core.options.handleSignals {
            signals.withLock { $0 = SignalHandling.install(session: self) }
        }
        let loop = RequestLoop(
            session: se, maxWorkers: core.options.maxThreads, threadName: core.options.threadName)
        requestLoop.withLock { $0 = loop }
        // The thread keeps the session alive until the loop has ended.
        let thread = startThread(name: core.options.threadName) { [self] in
            teardown(loopResult: loop.run(), loop: loop)
        }
        guard let thread else {
            lifecycle.withLock { $0.phase = .mounted }
            throw .threadCreationFailed
        }
        lifecycle.withLock { $0.loopThread = thread }
    }

    /// Serves in the foreground until the filesystem is unmounted.
    public func run() throws(FUSEError) {
        try start()
        try waitUntilFinished().get()
    }

    /// Serves until the filesystem is unmounted, without blocking a Swift-concurrency thread.
    public func run() async throws(FUSEError) {
        try start()
        let result = await withCheckedContinuation { continuation in
            onFinish { continuation.resume(returning: $0) }
        }
        joinLoopThread()
        try result.get()
    }

    /// Asks the session to end and returns at once; safe from a request handler or a signal
    /// watcher. ``unmount()`` also waits.
    public func requestUnmount() {
        let phase = lifecycle.withLock { state -> Phase in
            let phase = state.phase
            if phase == .running || phase == .mounted { state.phase = .stopping }
            return phase
        }
        switch phase {
        case .mounted:
            teardown(loopResult: 0)
        case .running:
            guard let se = core.session else { return }
            fuse_session_exit(se)
            // The loop returns now; the end of the session then takes the connection down, which
            // ends the workers' reads. (Waking a worker with a request of our own cannot work
            // once the mount has been detached from outside.)
            requestLoop.withLock { $0 }?.stop()
        case .stopping, .finished:
            break
        }
    }

    /// Ends the session (see the type's documentation) and waits until it has ended and the
    /// mount is gone. Do not call it from a request handler: the end waits for handlers.
    public func unmount() {
        requestUnmount()
        _ = waitUntilFinished()
    }

    /// True until the session has fully ended.
    public var isActive: Bool { lifecycle.withLock { $0.phase != .finished } }

    /// Blocks until the session has ended; returns how the loop ended.
    @discardableResult
    public func waitUntilFinished() -> Result<Void, FUSEError> {
        let result =
            lifecycle.wait(until: { $0.phase == .finished }) { $0.result ?? .success(()) }
            ?? .success(())
        joinLoopThread()
        return result
    }

    private func onFinish(_ callback: @escaping @Sendable (Result<Void, FUSEError>) -> Void) {
        let done = lifecycle.withLock { state -> Result<Void, FUSEError>? in
            if state.phase == .finished { return state.result ?? .success(()) }
            state.waiters.append(callback)
            return nil
        }
        if let done { callback(done) }
    }

    private func joinLoopThread() {
        let thread = lifecycle.withLock { state -> pthread_t? in
            guard !state.joined, let thread = state.loopThread else { return nil }
            state.joined = true
            return thread
        }
        if let thread, !pthread_equal(thread, pthread_self()).isTrue { pthread_join(thread, nil) }
    }

    private func teardown(loopResult: Int32, loop: RequestLoop? = nil) {
        let handling = signals.withLock { state -> SignalHandling? in
            defer { state = nil }
            return state
        }
        handling?.uninstall()
        // Handlers still working get a bounded time to answer.
        let pending = core.drain(timeout: core.options.drainTimeout)
        if pending > 0 {
            core.logger.warning("\(pending) replies still pending at unmount: dropped")
        }
        // Nothing reads requests any more: one sent now (or read and dropped by an exiting
        // worker) would wait for an answer that never comes, and so would whatever waits on
        // it — a lock the kernel holds for it, a spawning parent whose child is closing an
        // inherited descriptor, or `destroy` itself. Detach the mount, then fail them all.
        if let se = core.session {
            // Not abort first: libfuse skips the unmount of an aborted connection. The pin keeps
            // the detached file system, and so its connection number, ours until the abort.
            let pinned = docfs_pin_mount(mountpoint)
            // The unmount closes the session's descriptor of the device; this one stays to ask
            // whether the connection is still up.
            let device = fcntl(fuse_session_fd(se), F_DUPFD_CLOEXEC, 0)
            defer { if device >= 0 { close(device) } }
            fuse_session_unmount(se)
            abortConnection(pinned: pinned)
            // Detached from outside with files open, the connection is still up: the pin found
            // another file system at the mount point. Nothing will serve it again (a worker
            // that reads a request after the loop stopped drops it and ends), so whoever uses it
            // (a child closing an inherited descriptor, the holder of an open file) would wait
            // forever: end it.
            if device >= 0 { abortStillServedConnection(device: device) }
            // The workers' reads return now that the connection is gone. Workers still reading
            // after a grace period prove it is up.
            loop?.join { abortStillServedConnection(device: device) }
        }
        core.runDestroy()
        core.closeGate()
        core.notifications.stop()
        if let se = core.session {
            fuse_session_destroy(se)
        }
        core.session = nil
        Unmanaged.passUnretained(core).release()
        core.logger.debug("unmounted", metadata: ["mountpoint": "\(mountpoint)"])

        // The usual ends are not errors: an unmount (ENODEV), and an abort, which is also how
        // this kernel (6.18) ends a connection whose lazily detached mount lost its last open
        // file. A signal that ended the loop is reported as its number.
        let result: Result<Void, FUSEError> =
            loopResult == 0 || loopResult == SIGINT || loopResult == SIGTERM || loopResult == SIGHUP
                || loopResult == -ENODEV || loopResult == -ECONNABORTED
            ? .success(()) : .failure(.loopFailed(loopResult))
        let waiters = lifecycle.withLock { state in
            state.phase = .finished
            state.result = result
            defer { state.waiters = [] }
            return state.waiters
        }
        for waiter in waiters { waiter(result) }
    }
}

extension Int32 {
    fileprivate var isTrue: Bool { self != 0 }
}

// MARK: - Signals

/// The write end of the self-pipe that signal handlers write to (-1: none).
private let signalPipe = Atomic<Int32>(-1)

/// Turns SIGINT/SIGTERM/SIGHUP into ``Session/requestUnmount()``. The handler only writes the
/// signal number to a pipe (async-signal-safe); a watcher thread does the rest, so the signal
/// may land on any thread of the process.
private final class SignalHandling: Sendable {
    private static let stopSignals = [SIGINT, SIGTERM, SIGHUP]
    private let installed: [Int32]
    private let readFD: Int32
    private let writeFD: Int32
    private let thread: pthread_t?

    private init(installed: [Int32], readFD: Int32, writeFD: Int32, thread: pthread_t?) {
        self.installed = installed
        self.readFD = readFD
        self.writeFD = writeFD
        self.thread = thread
    }

    static func install(session: Session) -> SignalHandling? {
        var fds: [Int32] = [-1, -1]
        guard docfs_pipe_cloexec(&fds) == 0 else { return nil }
        guard
            signalPipe.compareExchange(expected: -1, desired: fds[1], ordering: .acquiringAndReleasing)
                .exchanged
        else {
            // Another session owns the signals.
            close(fds[0])
            close(fds[1])
            return nil
        }
        let readFD = fds[0]
        let thread = startThread(name: "fuse-signals") { [weak session] in
            var byte: UInt8 = 0
            while true {
                let n = read(readFD, &byte, 1)
                if n < 0 && errno == EINTR { continue }
                // 0 is the watcher's own stop byte.
                guard n == 1, byte != 0 else { return }
                session?.requestUnmount()
            }
        }
        var installed: [Int32] = []
        for sig in stopSignals + [SIGPIPE] where isDefault(sig) {
            var action = sigaction()
            if sig == SIGPIPE {
                // A no-op handler rather than SIG_IGN, so uninstall knows it was ours.
                action.__sigaction_handler.sa_handler = { _ in }
            } else {
                action.__sigaction_handler.sa_handler = { sig in
                    var byte = UInt8(truncatingIfNeeded: sig)
                    let fd = signalPipe.load(ordering: .relaxed)
                    if fd >= 0 { _ = write(fd, &byte, 1) }
                }
            }
            sigemptyset(&action.sa_mask)
            if sigaction(sig, &action, nil) == 0 { installed.append(sig) }
        }
        return SignalHandling(installed: installed, readFD: readFD, writeFD: fds[1], thread: thread)
    }

    /// Only signals at SIG_DFL are taken over, as libfuse does: a shell starts background jobs
    /// with SIGINT ignored, and an application's own handler wins.
    private static func isDefault(_ sig: Int32) -> Bool {
        var old = sigaction()
        guard sigaction(sig, nil, &old) == 0 else { return false }
        return old.__sigaction_handler.sa_handler == nil
    }

    func uninstall() {
        for sig in installed {
            var action = sigaction()
            action.__sigaction_handler.sa_handler = nil  // SIG_DFL
            sigemptyset(&action.sa_mask)
            sigaction(sig, &action, nil)
        }
        signalPipe.store(-1, ordering: .releasing)
        var stop: UInt8 = 0
        _ = write(writeFD, &stop, 1)
        if let thread, !pthread_equal(thread, pthread_self()).isTrue { pthread_join(thread, nil) }
        close(readFD)
        close(writeFD)
    }
}
