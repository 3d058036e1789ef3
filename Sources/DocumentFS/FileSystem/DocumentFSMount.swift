import DocumentEngine
import FUSE
import Logging
import VersionedStore

/// A document store mounted at a directory: the ``DocumentFileSystem`` and the FUSE session
/// serving it.
///
/// ```swift
/// let mount = try DocumentFSMount(store: store, at: "/mnt/docs")
/// try mount.start()      // serve on background threads; or mount.run() in the foreground
/// ...
/// mount.unmount()        // or `fusermount3 -u /mnt/docs` from anywhere
/// ```
public final class DocumentFSMount: Sendable {
    /// How to mount.
    public struct Options: Sendable {
        /// Mount read-only (`ro`): every change answers `EROFS`.
        public var readOnly = false
        /// Let other users in (`allow_other`; non-root needs `user_allow_other` in
        /// /etc/fuse.conf).
        public var allowOther = false
        /// The source shown in /proc/mounts and `df`.
        public var fsName = "docfs"
        /// Shown as the type `fuse.<subtype>`.
        public var subtype = "docfs"
        /// Further `-o` options, passed as written.
        public var extraOptions: [String] = []
        /// Unmount on SIGINT, SIGTERM and SIGHUP (for a daemon, not for tests or libraries).
        public var handleSignals = false
        /// libfuse's request trace on stderr.
        public var debug = false
        /// Most libfuse worker threads (handlers block on the store, so more than one helps).
        public var maxThreads = 10
        /// How long the end of a session waits for pending replies.
        public var drainTimeout: Duration = .seconds(5)
        /// Timeouts and polling of the file system.
        public var fileSystem = DocumentFileSystem.Configuration()
        public init() {}

        var mountOptions: MountOptions {
            var options = MountOptions()
            options.fsName = fsName
            options.subtype = subtype
            // The kernel checks the modes the store reports; `access` is never sent.
            options.defaultPermissions = true
            options.allowOther = allowOther
            options.readOnly = readOnly
            options.options = extraOptions
            options.handleSignals = handleSignals
            options.debug = debug
            options.maxThreads = maxThreads
            options.drainTimeout = drainTimeout
            options.threadName = "docfs-worker"
            return options
        }
    }

    /// The file system shown at ``mountpoint``.
    public let fileSystem: DocumentFileSystem
    /// The FUSE session (its ``Session/notifier`` is attached to ``fileSystem``).
    public let session: Session
    public var mountpoint: String { session.mountpoint }

    /// Mounts `store` at `mountpoint`. Nothing is served until ``start()`` or ``run()``: until
    /// then accesses to the mount wait.
    ///
    /// - Throws: ``FUSEError`` when the mount fails, a store error when the store cannot be read.
    public init(
        store: any FileSystemStore, at mountpoint: String, options: Options = Options(),
        logger: Logger = Logger(label: "docfs")
    ) throws {
        var configuration = options.fileSystem
        configuration.readOnly = configuration.readOnly || options.readOnly
        fileSystem = try DocumentFileSystem(
            store: store, configuration: configuration, logger: logger)
        session = try Session(
            filesystem: fileSystem, mountpoint: mountpoint, options: options.mountOptions,
            logger: logger)
        fileSystem.attach(session.notifier)
    }

    /// Goes to the background like sshfs (forks; the parent exits). Call it after `init` and
    /// before ``start()``/``run()``, before the process has started other threads.
    public func daemonize() throws {
        try session.daemonize()
    }

    /// Serves on background threads and returns (a background session).
    public func start() throws {
        try session.start()
    }

    /// Serves in the foreground until the mount is unmounted (a foreground session).
    public func run() throws {
        try session.run()
    }

    /// Ends the session and waits until the mount is gone.
    public func unmount() {
        session.unmount()
    }

    /// Asks the session to end and returns at once.
    public func requestUnmount() {
        session.requestUnmount()
    }

    /// Blocks until the session has ended (by ``unmount()``, `fusermount3 -u` or a signal).
    @discardableResult
    public func waitUntilFinished() -> Result<Void, FUSEError> {
        session.waitUntilFinished()
    }

    /// True until the session has ended.
    public var isActive: Bool { session.isActive }
}
