import ArgumentParser
import Foundation
import Logging

#if canImport(Glibc)
    import Glibc
#endif

/// `docfs unmount MOUNTPOINT [--lazy | --abort]`
struct Unmount: DocfsCommand {
    static let configuration = CommandConfiguration(
        abstract: "Unmount a docfs mount and wait for its daemon to finish.",
        discussion: """
            Unmounts (as `fusermount3 -u`, or umount(2) as root), then waits until the daemon \
            that served the mount has drained what it was saving and exited, at most --timeout \
            seconds. A mount in use (a file open in it, a shell's working directory) is busy: \
            close those, or detach it now with --lazy, which returns at once; the daemon then \
            ends when the last of them is closed. A daemon that hangs, or was killed while \
            the kernel waited on it, leaves processes stuck in the mount: --abort aborts the \
            mount's FUSE connection (fusectl), so that every request waiting for the daemon \
            fails with ENOTCONN, then detaches the mount. What that daemon had not saved is lost.
            """
    )

    @OptionGroup var global: GlobalOptions

    @Argument(help: "Where the store is mounted.")
    var mountpoint: String

    @Flag(name: [.customShort("z"), .long], help: "Detach now even if busy (fusermount3 -z).")
    var lazy = false

    @Flag(help: "Abort the FUSE connection first (a hung or killed daemon), then detach; implies --lazy.")
    var abort = false

    @Option(help: ArgumentHelp("Seconds to wait for the daemon to exit.", valueName: "seconds"))
    var timeout: Int = 30

    func validate() throws {
        guard timeout >= 0 else { throw ValidationError("--timeout must be 0 or more") }
    }

    func run() async throws {
        let logger = global.bootstrap()
        // A hung daemon would hang a lookup of the mount point itself.
        let path = abort ? MountPaths.resolvedParent(mountpoint) : MountPaths.resolved(mountpoint)
        guard let entry = MountTable.entry(at: path) else {
            // Unmounted already, by an earlier `docfs unmount` that gave up waiting, say: its
            // daemon may still be saving, or trying to save what it could not; waited for again.
            if !abort, !lazy, let daemon = DaemonRecord.read(DaemonRecord.file(for: path)),
                daemon.mountpoint == path, daemon.isRunning
            {
                try await wait(for: daemon, path, logger: logger)
                return
            }
            throw Failure("\(path) is not a docfs mount: nothing is mounted there")
        }
        guard entry.fileSystemType == MountTable.docfsType else {
            throw Failure("\(path) is not a docfs mount: it is \(entry.fileSystemType) (use umount)")
        }
        if getuid() != 0, let owner = entry.fuseOwner, owner != getuid() {
            throw Failure(
                "cannot unmount \(path): it was mounted by another user (uid \(owner)); they or root can")
        }
        // Found before unmounting: afterwards nothing links the daemon to the mount point.
        let daemon = DaemonRecord.find(mountpoint: path)
        logger.debug("unmounting", metadata: ["mountpoint": "\(path)", "daemon": "\(daemon?.pid ?? 0)"])
        if abort {
            try abortConnection(entry, path)
            try detach(path, lazily: true)
            if let daemon, !daemon.isRunning { daemon.remove() }
            return
        }
        try detach(path, lazily: lazy)
        guard let daemon, !lazy else { return }
        try await wait(for: daemon, path, logger: logger)
    }

    /// Waits, at most `timeout` seconds, for the daemon that served `path` to end; fails with
    /// what it cannot save while it keeps trying, or with what it gave up.
    private func wait(for daemon: DaemonRecord, _ path: String, logger: Logger) async throws {
        let deadline = ContinuousClock.now + .seconds(timeout)
        while daemon.isRunning {
            guard ContinuousClock.now < deadline else {
                if let unsaved = daemon.unsaved(), !unsaved.lost {
                    throw Failure(
                        "\(path) is unmounted, but its daemon (pid \(daemon.pid)) cannot save "
                            + unsaved.documents.joined(separator: "; ")
                            + ", and keeps trying (for 10 minutes from the unmount, or its -o final_save_retry=): "
                            + "make room, or bring the store back; `kill \(daemon.pid)` gives those changes up"
                    )
                }
                throw Failure(
                    "\(path) is unmounted, but its daemon (pid \(daemon.pid)) is still running after \(timeout) s; "
                        + "it may still be saving (see \(MountPaths.logFile.path))")
            }
            try await Task.sleep(for: .milliseconds(20))
        }
        logger.debug("the daemon has exited", metadata: ["pid": "\(daemon.pid)"])
        let unsaved = daemon.unsaved()
        daemon.reportUnsaved([], lost: false)
        // A daemon that was killed could not remove its pid file.
        daemon.remove()
        if let unsaved {
            throw Failure(
                "\(path) is unmounted, but its daemon could not save \(unsaved.documents.joined(separator: "; ")): "
                    + "those changes are lost (see \(MountPaths.logFile.path))")
        }
    }

    /// Removes the mount: umount2 as root (it says EBUSY itself), fusermount3 otherwise (which
    /// checks that this user may).
    private func detach(_ path: String, lazily lazy: Bool) throws {
        if getuid() == 0 {
            guard umount2(path, lazy ? Int32(MNT_DETACH) : 0) == 0 else {
                throw failure(path, errno: errno, detail: errnoText())
            }
            return
        }
        let result = try runFusermount(["-u"] + (lazy ? ["-z"] : []) + ["--", path])
        guard result.status != 0 else { return }
        // fusermount3 says "fusermount3: failed to unmount PATH: Device or resource busy".
        let message = result.error.split(whereSeparator: \.isNewline).first.map(String.init) ?? ""
        // "…/fusermount3: what went wrong": the program's name is noise here.
        let detail =
            message.hasPrefix("/") || message.hasPrefix("fusermount")
            ? String(message.drop { $0 != ":" }.dropFirst().drop { $0 == " " }) : message
        throw failure(
            path, errno: message.contains(String(cString: strerror(EBUSY))) ? EBUSY : 0,
            detail: detail.isEmpty ? "fusermount3 failed (exit status \(result.status))" : detail)
    }

    /// Writes to the connection's `abort` file in fusectl, mounting fusectl first if it is not
    /// (as root; systemd mounts it at boot).
    private func abortConnection(_ entry: MountEntry, _ path: String) throws {
        guard let connection = entry.minorDevice else {
            throw Failure("cannot abort \(path): the mount table gives no device number for it")
        }
        let connections = "/sys/fs/fuse/connections"
        let listed = (try? FileManager.default.contentsOfDirectory(atPath: connections)) ?? []
        if listed.isEmpty && getuid() == 0 {
            _ = Glibc.mount("fusectl", connections, "fusectl", 0, nil)
        }
        let abortFile = "\(connections)/\(connection)/abort"
        let fd = open(abortFile, O_WRONLY | O_CLOEXEC)
        guard fd >= 0 else {
            throw Failure("cannot abort \(path): \(abortFile): \(errnoText())")
        }
        defer { close(fd) }
        guard write(fd, "1", 1) == 1 else {
            throw Failure("cannot abort \(path): writing \(abortFile): \(errnoText())")
        }
    }

    private func failure(_ path: String, errno code: Int32, detail: String) -> Failure {
        if code == EBUSY {
            return Failure(
                "cannot unmount \(path): it is busy (a file is open in it, or a process's working "
                    + "directory is in it); close those, or detach it now with --lazy")
        }
        return Failure("cannot unmount \(path): \(detail)")
    }

    private func runFusermount(_ arguments: [String]) throws -> (status: Int32, error: String) {
        let process = Process()
        let candidates = ["/usr/bin/fusermount3", "/bin/fusermount3"]
        guard let program = candidates.first(where: { FileManager.default.isExecutableFile(atPath: $0) })
        else {
            throw Failure(
                "fusermount3 is missing (package fuse3); it unmounts FUSE file systems for users other than root"
            )
        }
        process.executableURL = URL(fileURLWithPath: program)
        process.arguments = arguments
        let errors = Pipe()
        process.standardError = errors
        process.standardOutput = FileHandle.nullDevice
        process.standardInput = FileHandle.nullDevice
        try process.run()
        let data = errors.fileHandleForReading.readDataToEndOfFile()
        process.waitUntilExit()
        return (process.terminationStatus, String(decoding: data, as: UTF8.self))
    }
}
