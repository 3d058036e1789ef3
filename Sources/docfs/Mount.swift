import ArgumentParser
import CLinuxSupport
import DocumentEngine
import DocumentFS
import FUSE
import Foundation
import Logging
import SQLiteStore
import VersionedStore

#if canImport(Glibc)
    import Glibc
#endif

/// `docfs mount [STORE] MOUNTPOINT [-f] [-o OPTIONS]…`
struct Mount: DocfsCommand {
    static let configuration = CommandConfiguration(
        abstract: "Mount a store as a file system.",
        usage: "docfs mount [STORE] MOUNTPOINT [--foreground] [-o OPTION[,OPTION…]]…",
        discussion: """
            Shows the store's documents at MOUNTPOINT: a package document is a folder, a flat \
            document a file. By default docfs checks everything, mounts, and returns once the \
            mount is live, leaving a daemon that serves it; its log is \
            $XDG_STATE_HOME/docfs/docfs.log (~/.local/state/docfs/docfs.log). With --foreground \
            it serves until unmounted and logs on standard error; SIGTERM, SIGINT and SIGHUP \
            unmount it. SIGUSR1 makes the daemon log its store's statistics (content chunks and \
            bytes read and written since it started).

            STORE may be a PostgreSQL URL, postgres://[user[:password]@]host[:port]/database \
            (PG* variables fill in the rest); several machines can mount one such store, and \
            each sees the others' saves within a second. flock and POSIX record locks are the \
            store's: every mount of it, on any machine, sees them.

            Options (-o, comma-separated, repeatable): ro, rw (the default), allow_other (let \
            other users in; needs user_allow_other in /etc/fuse.conf unless run as root), debug \
            (libfuse's request trace), fsname=NAME (the source shown by mount and df; default: \
            the store's path), nonempty (mount over a folder that is not empty), \
            quiet_interval=SECONDS (save a changed document this long after its last change even \
            while its files stay open; default 1), final_save_retry=SECONDS (how long the \
            daemon, once unmounted, keeps trying to save what fails to save, a full disk or a \
            lost server, before it gives those changes up; default 600), attr_timeout=SECONDS and \
            entry_timeout=SECONDS (how long the kernel caches attributes and names; default 60; \
            other processes' and mounts' saves invalidate them regardless), \
            collect_interval=SECONDS (how often the store's retention policy is applied in the \
            background, see `docfs retention`; default 3600, 0 never), archives=xml (binary \
            property lists, keyed archives included, read as XML text, and text written back is \
            stored as a binary property list again; text that is not one is refused with EINVAL \
            at close or fsync; see `docfs plist`), housekeeping=keep (store the .DS_Store, ._*, \
            Thumbs.db and desktop.ini files other systems' file managers leave; by default they \
            work in the mount but are never stored, like editors' swap files), \
            no_writeback_cache (send every write(2) to the daemon as it happens instead of \
            letting the kernel cache and merge writes; writeback_cache is the default for a store \
            file, no_writeback_cache for a PostgreSQL store, so that files other machines change \
            reach the processes that keep them open here), close_to_open (a close of a changed \
            file returns once it is saved, so that an open on another mount sees the change; the \
            default for a PostgreSQL store, no_close_to_open for a store file, where a close \
            queues the save for a moment later; a close of a file the mount holds a lock on \
            saves at once either way). mount(8)'s \
            dev, suid, exec, auto, user, _netdev, defaults and the like are ignored (a docfs \
            mount is always nosuid,nodev); anything else goes to libfuse as written.

            `docfs unmount MOUNTPOINT` unmounts and waits for the daemon to finish. \
            `mount -t fuse.docfs STORE MOUNTPOINT` and fstab lines of type fuse.docfs run \
            docfs through mount.fuse.docfs and mount.fuse3 (see mount.fuse.docfs(8)).
            """
    )

    @Argument(
        help: ArgumentHelp(
            "An optional STORE, then the MOUNTPOINT, an empty folder (see USAGE).",
            valueName: "store-and-mountpoint"))
    var arguments: [String] = []

    @Flag(name: [.customShort("f"), .long], help: "Serve in the foreground until unmounted.")
    var foreground = false

    @Option(
        name: .customShort("o"),
        help: ArgumentHelp("Mount options, comma-separated (see below).", valueName: "options"))
    var options: [String] = []

    @Option(
        help: ArgumentHelp(
            "How much to log: on standard error in the foreground, in the log file in the background."))
    var logLevel: LogLevel = .notice

    /// Set by the background launcher on the daemon it starts: the descriptor on which the
    /// daemon reports "mounted" or the error that stopped it.
    @Option(help: .hidden)
    var readyFd: Int32?

    func validate() throws {
        _ = try Positionals.split(arguments, needs: ["MOUNTPOINT"])
    }

    func run() async throws {
        let (storeArgument, rest) = try Positionals.split(arguments, needs: ["MOUNTPOINT"])
        let ready = readyFd.map(ReadyChannel.init)
        if ready != nil {
            // The daemon must not keep the folder it was started from busy.
            _ = chdir("/")
        }
        let logger = bootstrapLogging()
        do {
            let plan = try MountPlan.check(
                store: try StoreLocation(storeArgument), mountpoint: rest[0], options: FuseOptions(options),
                logger: logger)
            if foreground || ready != nil {
                try await serve(plan, ready: ready, logger: logger)
            } else {
                try launchDaemon(plan)
            }
        } catch {
            ready?.send("error: " + Failure.describe(error))
            throw error
        }
    }

    /// Sends every logger to standard error (the log file, for a daemon), tagged with the pid
    /// so that the lines of several daemons in one log can be told apart.
    private func bootstrapLogging() -> Logger {
        let level = logLevel.level
        let pid = getpid()
        LoggingSystem.bootstrap { label in
            var handler = StreamLogHandler.standardError(label: label)
            handler.logLevel = level
            handler.metadata["pid"] = "\(pid)"
            return handler
        }
        return Logger(label: "docfs")
    }

    /// Mounts and serves until the mount is unmounted (`docfs unmount`, `fusermount3 -u`, or a
    /// signal).
    private func serve(_ plan: MountPlan, ready: ReadyChannel?, logger: Logger) async throws {
        // A shell's background job starts with SIGINT ignored, and libfuse's handling only takes
        // signals still at their default; SIGTERM at least must always unmount cleanly.
        signal(SIGTERM, SIG_DFL)
        var options = DocumentFSMount.Options()
        options.readOnly = plan.options.readOnly
        options.allowOther = plan.options.allowOther
        options.debug = plan.options.debug
        options.fsName = plan.options.fsName ?? plan.storePath
        if let quiet = plan.options.quietInterval { options.fileSystem.quietInterval = quiet }
        if let timeout = plan.options.attributeTimeout { options.fileSystem.attributeTimeout = timeout }
        if let timeout = plan.options.entryTimeout { options.fileSystem.entryTimeout = timeout }
        if let interval = plan.options.collectInterval { options.fileSystem.collectionInterval = interval }
        options.fileSystem.archivesAsText = plan.options.archivesAsText
        // On a store other machines share, a file one of them changes must reach the processes
        // that keep it open here (a database under its locks), with its new size, which the
        // writeback cache would keep at the kernel's.
        options.fileSystem.writebackCache = plan.options.writebackCache ?? !plan.shared
        // And a file closed on one machine opens with its change on the others.
        options.fileSystem.closeToOpen = plan.options.closeToOpen ?? plan.shared
        if plan.options.keepHousekeeping { options.fileSystem.scratchNames = .editorsOnly }
        options.extraOptions = plan.options.passThrough
        options.handleSignals = true
        // The mount is gone by the time the last saves run: what fails then (a full disk, a
        // lost server) is tried again for a while rather than dropped, and `docfs unmount`,
        // waiting for this process, says why it waits and what was lost if it gives up.
        options.fileSystem.finalSaveRetry = plan.options.finalSaveRetry ?? Self.finalSaveRetry
        let record = DaemonRecord.current(mountpoint: plan.mountpoint, store: plan.storePath)
        options.fileSystem.unsavedChanged = { documents in record?.reportUnsaved(documents, lost: false) }
        let mount: DocumentFSMount
        do {
            mount = try DocumentFSMount(
                store: plan.store, at: plan.mountpoint, options: options, logger: logger)
            try mount.start()
        } catch let error as FUSEError {
            throw Failure(Self.describe(error, plan: plan))
        }
        // Mounted is not yet working: the kernel's INIT is answered by the loop just started,
        // and libfuse can still end the session there (contradictory options, say). A statfs
        // through the mount waits for INIT and then goes through the file system.
        if let problem = await Self.probe(plan.mountpoint) {
            mount.unmount()
            throw Failure("the mount at \(plan.mountpoint) did not come up: \(problem)")
        }
        do {
            try record?.write()
        } catch {
            logger.warning(
                "cannot write the pid file: \(Failure.describe(error)); `docfs unmount` will look for this process"
            )
        }
        // Content chunks and bytes read and written, for scripts/bench.sh and for anyone curious.
        StatisticsSignal.install(store: plan.store, logger: logger)
        logger.notice(
            "mounted", metadata: ["store": "\(plan.storePath)", "mountpoint": "\(plan.mountpoint)"])
        ready?.send("mounted")
        ready?.close()

        // waitUntilFinished blocks: keep it off the cooperative pool.
        let result = await withCheckedContinuation { continuation in
            Thread.detachNewThread { continuation.resume(returning: mount.waitUntilFinished()) }
        }
        let unsaved = mount.fileSystem.unsavedDocuments
        if !unsaved.isEmpty { record?.reportUnsaved(unsaved, lost: true) }
        record?.remove()
        // The unmount saved everything: the daemon's intent log holds nothing to replay, and
        // the store file alone can be copied.
        if let problem = (plan.store as? SQLiteStore)?.finishWriting() {
            logger.notice(
                "the store's log keeps the last saves (is another process using the store?): \(problem)")
        }
        logger.notice("unmounted", metadata: ["mountpoint": "\(plan.mountpoint)"])
        if case .failure(let error) = result { throw Failure(Self.describe(error, plan: plan)) }
        if !unsaved.isEmpty {
            throw Failure(
                "unmounted, but could not save \(unsaved.joined(separator: "; ")): those changes are lost")
        }
    }

    /// How long a daemon whose last saves fail keeps trying before it gives them up.
    static let finalSaveRetry: Duration = .seconds(600)

    /// statfs's `f_type` for a FUSE file system.
    static let fuseSuperMagic: Int64 = 0x6573_5546

    /// nil when a statfs through `mountpoint` reaches the FUSE file system, else what went wrong.
    /// On a thread of its own: it blocks until the session answers.
    static func probe(_ mountpoint: String) async -> String? {
        await withCheckedContinuation { continuation in
            Thread.detachNewThread {
                let type = docfs_fs_type(mountpoint)
                let problem: String?
                if type < 0 {
                    problem = errnoText()
                } else if type != Self.fuseSuperMagic {
                    // The session already ended and its mount is gone: this was the folder under it.
                    problem = "libfuse ended the session at once"
                } else {
                    problem = nil
                }
                continuation.resume(returning: problem)
            }
        }
    }

    static func describe(_ error: FUSEError, plan: MountPlan) -> String {
        switch error {
        case .invalidMountpoint(let path, let errno):
            return "cannot mount on \(path): \(errnoText(errno.rawValue))"
        case .sessionCreationFailed:
            // libfuse names the option it did not know on standard error (or in the log).
            let extra = plan.options.passThrough
            return extra.isEmpty
                ? "libfuse refused the mount options"
                : "libfuse refused the mount options (unknown to docfs, passed on): \(extra.joined(separator: ","))"
        case .mountFailed(let path):
            // libfuse or fusermount3 has said why on standard error: the line above, or for a
            // daemon the log, from which the launcher quotes it.
            return "mounting \(plan.storePath) at \(path) failed"
        case .loopFailed(let code):
            return "serving \(plan.mountpoint) failed: \(code < 0 ? errnoText(-code) : "signal \(code)")"
        default:
            return "cannot serve the mount at \(plan.mountpoint): \(error)"
        }
    }

    // MARK: Background

    /// How long the launcher waits for the daemon to mount.
    static let startTimeout: Duration = .seconds(60)

    /// Starts this program again as the daemon (`--foreground --ready-fd 3`) in a session of its
    /// own, and returns once it reports the mount live, or throws its error.
    ///
    /// Not fork: the Swift concurrency runtime's threads do not survive it, so the daemon is a
    /// fresh process (posix_spawn of /proc/self/exe) that checks and mounts on its own.
    private func launchDaemon(_ plan: MountPlan) throws {
        var arguments = ["mount", "--foreground", "--ready-fd", "\(ReadyChannel.childDescriptor)"]
        arguments += ["--log-level", logLevel.rawValue]
        for option in options { arguments += ["-o", option] }
        arguments += [plan.storeArgument, plan.mountpoint]
        let log = MountPaths.logFile
        var logPath: String? = log.path
        do {
            try MountPaths.makeDirectory(log.deletingLastPathComponent())
        } catch {
            printError(
                "cannot create the log folder \(log.deletingLastPathComponent().path): the daemon will not log"
            )
            logPath = nil
        }
        let daemon = try DaemonLauncher.spawn(arguments: arguments, log: logPath)
        let seeLog = logPath.map { "; see \($0)" } ?? ""
        switch daemon.waitForReport(timeout: Self.startTimeout) {
        case .mounted:
            // A read of mountinfo can miss an entry while other mounts come and go (the kernel
            // hands it out in pieces), so look a few times before calling the mount missing.
            var listed = false
            for attempt in 0..<20 {
                if MountTable.entry(at: plan.mountpoint)?.fileSystemType == MountTable.docfsType {
                    listed = true
                    break
                }
                if attempt < 19 { usleep(50_000) }
            }
            guard listed else {
                throw Failure(
                    "the daemon reported \(plan.mountpoint) mounted, but it is not in the mount table\(seeLog)"
                )
            }
        case .failed(let message):
            daemon.reap()
            // libfuse says why on the daemon's standard error, which is the log.
            let reason = daemon.libfuseComplaint(inLog: logPath).map { " (\($0))" } ?? ""
            throw Failure(message + reason)
        case .exited(let status):
            let reason = daemon.libfuseComplaint(inLog: logPath).map { " (\($0))" } ?? ""
            throw Failure(
                "the docfs daemon ended (\(status)) before mounting \(plan.mountpoint)\(reason)\(seeLog)")
        case .timedOut:
            kill(daemon.pid, SIGTERM)
            throw Failure(
                "the docfs daemon did not mount \(plan.mountpoint) within \(Self.startTimeout.components.seconds) s\(seeLog)"
            )
        }
    }
}

/// What `docfs mount` will mount, once every check has passed.
struct MountPlan {
    var store: any VersionedDocumentStore
    /// The store file's path or database URL (without a password), for messages and the mount table.
    var storePath: String
    /// The store as given, for the daemon's command line.
    var storeArgument: String
    /// Absolute, links resolved, as the mount table will show it.
    var mountpoint: String
    var options: FuseOptions
    /// A PostgreSQL store, which other machines may mount too.
    var shared = false

    /// Every check that can be made before mounting, each failing with its own one-line
    /// message: the store, the mount point, the FUSE device, and `allow_other`'s permission.
    static func check(store location: StoreLocation, mountpoint: String, options: FuseOptions, logger: Logger)
        throws -> MountPlan
    {
        let refused = options.refusedByLibfuse()
        if !refused.isEmpty {
            let plural = refused.count == 1 ? "" : "s"
            throw Failure(
                "unknown mount option\(plural) \(refused.joined(separator: ",")) (neither docfs nor libfuse knows it)"
            )
        }
        let store = try location.open(logger: logger)
        // A store copied without its packs' folder would mount, and its large files fail to read.
        if let problem = (store as? SQLiteStore)?.missingPackFolderProblem { throw Failure(problem) }
        // A mount would show those files without their acknowledged changes.
        if let unsaved = (store as? SQLiteStore)?.unreplayedIntentLogs.first {
            throw Failure(
                "cannot save the changes a killed process logged in \(unsaved); free space or fix the error, then mount again"
            )
        }
        if !options.readOnly, location.postgres == nil, access(location.path, W_OK) != 0 {
            throw Failure(
                "cannot write the store \(location.path): \(errnoText()); mount it read-only with -o ro")
        }
        let resolved = try checkMountpoint(mountpoint, nonEmpty: options.nonEmpty)
        try checkDevice()
        if options.allowOther, getuid() != 0, !userAllowOther() {
            throw Failure("-o allow_other needs user_allow_other in /etc/fuse.conf (or mounting as root)")
        }
        return MountPlan(
            store: store, storePath: location.path, storeArgument: location.argument, mountpoint: resolved,
            options: options, shared: location.postgres != nil)
    }

    /// The mount point, absolute with links resolved, if it can be mounted on.
    static func checkMountpoint(_ argument: String, nonEmpty: Bool) throws -> String {
        let absolute = MountPaths.absolute(argument)
        var st = stat()
        if stat(absolute, &st) != 0 {
            let code = errno
            switch code {
            case ENOENT:
                throw Failure(
                    "the mount point \(absolute) does not exist; create it with `mkdir -p \(shellQuoted(absolute))`"
                )
            case ENOTCONN:
                throw Failure(
                    "\(absolute) is a mount whose daemon has died; unmount it with `docfs unmount \(shellQuoted(absolute))`"
                )
            case EACCES:
                throw Failure("cannot reach the mount point \(absolute): permission denied")
            default:
                throw Failure("cannot use the mount point \(absolute): \(errnoText(code))")
            }
        }
        guard (st.st_mode & S_IFMT) == S_IFDIR else {
            throw Failure("the mount point \(absolute) is not a directory")
        }
        let resolved = MountPaths.resolved(absolute)
        if let entry = MountTable.entry(at: resolved) {
            throw Failure(
                "the mount point \(resolved) is busy: \(entry.source) (\(entry.fileSystemType)) is already mounted there"
            )
        }
        // fusermount3's rule for users other than root; checked here for a clear message.
        if getuid() != 0, access(resolved, W_OK) != 0 {
            throw Failure("no permission to mount on \(resolved): mounting needs write access to it")
        }
        if !nonEmpty {
            guard let directory = opendir(resolved) else {
                throw Failure("cannot read the mount point \(resolved): \(errnoText())")
            }
            defer { closedir(directory) }
            while let entry = readdir(directory) {
                let name = withUnsafeBytes(of: entry.pointee.d_name) { raw in
                    String(decoding: raw.prefix { $0 != 0 }, as: UTF8.self)
                }
                if name != "." && name != ".." {
                    throw Failure(
                        "the mount point \(resolved) is not empty; empty it, or mount over its contents with -o nonempty"
                    )
                }
            }
        }
        return resolved
    }

    /// The FUSE device must exist. (fusermount3 opens it for users other than root, so its
    /// mode is not this process's business.)
    static func checkDevice() throws {
        // DOCFS_FUSE_DEVICE exists for the tests, which cannot remove the real device: only
        // this check reads it.
        let device = ProcessInfo.processInfo.environment["DOCFS_FUSE_DEVICE"] ?? "/dev/fuse"
        var st = stat()
        guard stat(device, &st) == 0 else {
            throw Failure(
                "\(device) is missing (\(errnoText())): load the fuse module (`modprobe fuse`), or give the container the device (`--device /dev/fuse`)"
            )
        }
        guard (st.st_mode & S_IFMT) == S_IFCHR else {
            throw Failure("\(device) is not the FUSE device (not a character device)")
        }
        // libfuse opens the device itself before it falls back to fusermount3, and gives up if
        // it cannot: users other than root need it readable and writable (its usual mode 0666).
        if getuid() != 0, access(device, R_OK | W_OK) != 0 {
            throw Failure(
                "no permission to use \(device) (mode 0\(String(st.st_mode & 0o777, radix: 8))): mounting as a user "
                    + "other than root needs it readable and writable by that user (usually 0666)")
        }
    }

    /// Whether /etc/fuse.conf lets users other than root use allow_other.
    static func userAllowOther() -> Bool {
        guard let text = try? String(contentsOfFile: "/etc/fuse.conf", encoding: .utf8) else { return false }
        return text.split(separator: "\n").contains {
            $0.trimmingCharacters(in: .whitespaces) == "user_allow_other"
        }
    }
}

// MARK: - The daemon's start

/// The pipe on which a daemon tells its launcher how mounting went: one line, "mounted" or
/// "error: MESSAGE", then end of file.
struct ReadyChannel {
    /// The descriptor the launcher gives the daemon.
    static let childDescriptor: Int32 = 3

    let fd: Int32

    init(_ fd: Int32) { self.fd = fd }

    func send(_ line: String) {
        let bytes = Array((line.split(whereSeparator: \.isNewline).joined(separator: " ") + "\n").utf8)
        var offset = 0
        while offset < bytes.count {
            let n = bytes.withUnsafeBytes { raw -> Int in
                guard let base = raw.baseAddress else { return 0 }
                return write(fd, base + offset, raw.count - offset)
            }
            if n < 0, errno == EINTR { continue }
            guard n > 0 else { return }  // the launcher is gone: nobody to tell
            offset += n
        }
    }

    func close() { _ = Glibc.close(fd) }
}

/// A daemon started by ``DaemonLauncher/spawn(arguments:log:)``.
struct DaemonLauncher {
    enum Report: Equatable {
        case mounted
        case failed(String)
        /// Ended without a report: how ("exit status 2", "signal 9").
        case exited(String)
        case timedOut
    }

    let pid: pid_t
    /// The launcher's end of the ready pipe.
    private let reports: Int32
    /// The log's size when the daemon started: what it wrote comes after.
    private let logStart: UInt64

    /// POSIX_SPAWN_SETSID (glibc 2.26): a GNU extension Swift's Glibc module does not export.
    private static let spawnSetSID: Int32 = 0x80

    /// Runs /proc/self/exe with `arguments` in a new session: standard input from /dev/null,
    /// standard output and error appended to `log` (or /dev/null), the ready pipe as
    /// descriptor 3 and no other descriptor, default handling of the signals that unmount.
    static func spawn(arguments: [String], log: String?) throws -> DaemonLauncher {
        var fds: [Int32] = [-1, -1]
        guard pipe(&fds) == 0 else { throw Failure("cannot start the daemon: pipe: \(errnoText())") }
        let (readEnd, writeEnd) = (fds[0], fds[1])
        _ = fcntl(readEnd, F_SETFD, FD_CLOEXEC)
        // Above 3, so that the dup2 onto 3 below really copies it (a dup2 onto itself would
        // leave close-on-exec as it is).
        let highWriteEnd = fcntl(writeEnd, F_DUPFD_CLOEXEC, 10)
        Glibc.close(writeEnd)
        guard highWriteEnd >= 0 else {
            Glibc.close(readEnd)
            throw Failure("cannot start the daemon: \(errnoText())")
        }
        defer { Glibc.close(highWriteEnd) }

        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0)
        posix_spawn_file_actions_addopen(
            &actions, 1, log ?? "/dev/null", O_WRONLY | O_APPEND | O_CREAT, 0o600)
        posix_spawn_file_actions_adddup2(&actions, 1, 2)
        posix_spawn_file_actions_adddup2(&actions, highWriteEnd, ReadyChannel.childDescriptor)
        // A daemon that inherited, say, a test harness's pipe would keep its reader waiting
        // for end of file for as long as the mount lives. Descriptors marked close-on-exec go
        // anyway; close the others.
        for fd in inheritableDescriptors() where fd > ReadyChannel.childDescriptor {
            posix_spawn_file_actions_addclose(&actions, fd)
        }

        var attributes = posix_spawnattr_t()
        posix_spawnattr_init(&attributes)
        defer { posix_spawnattr_destroy(&attributes) }
        var defaults = sigset_t()
        sigemptyset(&defaults)
        for sig in [SIGTERM, SIGINT, SIGHUP, SIGPIPE] { sigaddset(&defaults, sig) }
        posix_spawnattr_setsigdefault(&attributes, &defaults)
        var mask = sigset_t()
        sigemptyset(&mask)
        posix_spawnattr_setsigmask(&attributes, &mask)
        posix_spawnattr_setflags(
            &attributes, Int16(spawnSetSID | Int32(POSIX_SPAWN_SETSIGDEF) | Int32(POSIX_SPAWN_SETSIGMASK)))

        let logStart =
            log.flatMap { try? FileManager.default.attributesOfItem(atPath: $0)[.size] as? UInt64 } ?? 0
        let argv = (["docfs"] + arguments).map { strdup($0) } + [nil]
        defer { for p in argv { free(p) } }
        var pid: pid_t = 0
        let rc = posix_spawn(&pid, "/proc/self/exe", &actions, &attributes, argv, environ)
        guard rc == 0 else {
            Glibc.close(readEnd)
            throw Failure("cannot start the daemon: \(errnoText(rc))")
        }
        return DaemonLauncher(pid: pid, reports: readEnd, logStart: logStart)
    }

    /// The first line libfuse or fusermount3 wrote to the log since the daemon started.
    func libfuseComplaint(inLog log: String?) -> String? {
        guard let log, let file = FileHandle(forReadingAtPath: log) else { return nil }
        defer { try? file.close() }
        guard (try? file.seek(toOffset: logStart)) != nil, let data = try? file.read(upToCount: 1 << 20)
        else {
            return nil
        }
        return String(decoding: data, as: UTF8.self).split(whereSeparator: \.isNewline).first {
            $0.hasPrefix("fuse: ") || $0.hasPrefix("fusermount")
        }.map(String.init)
    }

    /// Open descriptors without close-on-exec.
    private static func inheritableDescriptors() -> [Int32] {
        let names = (try? FileManager.default.contentsOfDirectory(atPath: "/proc/self/fd")) ?? []
        return names.compactMap(Int32.init).filter { fd in
            let flags = fcntl(fd, F_GETFD)
            return flags >= 0 && flags & FD_CLOEXEC == 0
        }
    }

    /// Waits for the daemon's one line, its end, or the timeout.
    func waitForReport(timeout: Duration) -> Report {
        defer { Glibc.close(reports) }
        let deadline = ContinuousClock.now + timeout
        var received: [UInt8] = []
        var buffer = [UInt8](repeating: 0, count: 512)
        while !received.contains(UInt8(ascii: "\n")) {
            let left = ContinuousClock.now.duration(to: deadline)
            guard left > .zero else { return .timedOut }
            var poller = pollfd(fd: reports, events: Int16(POLLIN), revents: 0)
            let milliseconds = Int32(min(left.components.seconds * 1000 + 1, 60_000))
            let ready = poll(&poller, 1, milliseconds)
            if ready < 0, errno == EINTR { continue }
            guard ready > 0 else { continue }
            let n = buffer.withUnsafeMutableBytes { read(reports, $0.baseAddress, $0.count) }
            if n < 0, errno == EINTR { continue }
            guard n > 0 else { break }
            received += buffer[0..<n]
        }
        let line = String(decoding: received.prefix { $0 != UInt8(ascii: "\n") }, as: UTF8.self)
        if line == "mounted" { return .mounted }
        if line.hasPrefix("error: ") { return .failed(String(line.dropFirst("error: ".count))) }
        return .exited(reap())
    }

    /// Collects the daemon after it failed; returns how it ended.
    @discardableResult
    func reap() -> String {
        var status: Int32 = 0
        // Bounded: a daemon that reported an error exits at once.
        for _ in 0..<200 {
            let rc = waitpid(pid, &status, WNOHANG)
            if rc == pid {
                // WIFEXITED / WTERMSIG by hand: the macros are not imported.
                let signal = status & 0x7f
                return signal == 0 ? "exit status \((status >> 8) & 0xff)" : "signal \(signal)"
            }
            if rc < 0 { return "status unknown" }
            usleep(10_000)
        }
        return "still running"
    }
}
