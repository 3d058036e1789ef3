import ArgumentParser
import DocumentEngine
import FUSE
import Foundation

#if canImport(Glibc)
    import Glibc
#endif

// What `docfs mount` and `docfs unmount` share: the kernel's mount table, `-o` options, the
// daemon's pid file and log, and the mount.fuse3 helper's calling convention.

// MARK: - The mount table

/// One line of `/proc/self/mountinfo`.
struct MountEntry: Equatable {
    /// Where it is mounted, as the kernel reports it (absolute, symbolic links resolved).
    var mountPoint: String
    /// `fuse.docfs` for a docfs mount.
    var fileSystemType: String
    /// The source (for docfs: the `fsname=`, by default the store's path).
    var source: String
    /// The per-mount options (`rw`, `nosuid`, …).
    var options: [String]
    /// The file system's own options (for FUSE: `user_id=`, `default_permissions`, …).
    var superOptions: [String] = []
    /// The device's minor number: for a FUSE mount, its connection's number in fusectl
    /// (`/sys/fs/fuse/connections/N`).
    var minorDevice: UInt32?

    /// For a FUSE mount, the user who mounted it (`user_id=`).
    var fuseOwner: uid_t? {
        superOptions.first { $0.hasPrefix("user_id=") }.flatMap { uid_t($0.dropFirst("user_id=".count)) }
    }
}

enum MountTable {
    /// The file system type of every docfs mount (`subtype=docfs`).
    static let docfsType = "fuse.docfs"

    /// The mounts this process sees, in mount order (later ones are on top).
    static func entries() -> [MountEntry] {
        // mountinfo rather than /proc/self/mounts: it is the kernel's own view, and its fields
        // cannot be confused by a source that contains spaces (they are escaped in both).
        guard let text = readSystemFile("/proc/self/mountinfo") else {
            return []
        }
        return text.split(separator: "\n").compactMap { line in
            let fields = line.split(separator: " ", omittingEmptySubsequences: false).map(String.init)
            // id parent major:minor root mountpoint options [optional fields…] - type source super
            guard fields.count >= 10, let dash = fields.firstIndex(of: "-"), dash >= 6,
                dash + 2 < fields.count
            else { return nil }
            return MountEntry(
                mountPoint: unescape(fields[4]), fileSystemType: unescape(fields[dash + 1]),
                source: unescape(fields[dash + 2]), options: fields[5].split(separator: ",").map(String.init),
                superOptions: dash + 3 < fields.count
                    ? fields[dash + 3].split(separator: ",").map(String.init) : [],
                minorDevice: fields[2].split(separator: ":").last.flatMap { UInt32($0) })
        }
    }

    /// The topmost mount at `path` (an absolute path with links resolved), if any.
    static func entry(at path: String) -> MountEntry? {
        entries().last { $0.mountPoint == path }
    }

    /// The kernel writes space, tab, newline and backslash as `\ooo` octal escapes.
    static func unescape(_ field: String) -> String {
        guard field.contains("\\") else { return field }
        let utf8 = Array(field.utf8)
        let zero = UInt8(ascii: "0")
        var bytes: [UInt8] = []
        var i = 0
        while i < utf8.count {
            if utf8[i] == UInt8(ascii: "\\"), i + 3 < utf8.count {
                let digits = utf8[(i + 1)..<min(i + 4, utf8.count)]
                if digits.count == 3, digits.allSatisfy({ $0 >= zero && $0 <= zero + 7 }) {
                    let value = digits.reduce(0) { $0 * 8 + Int($1 - zero) }
                    if value < 256 {
                        bytes.append(UInt8(value))
                        i += 4
                        continue
                    }
                }
            }
            bytes.append(utf8[i])
            i += 1
        }
        return String(decoding: bytes, as: UTF8.self)
    }
}

// MARK: - Paths

enum MountPaths {
    /// `path` made absolute against the working directory, with `.` and `..` removed.
    static func absolute(_ path: String) -> String {
        // isDirectory given: otherwise Foundation stats the path to tell, which a hung daemon
        // would never answer.
        URL(fileURLWithPath: path, isDirectory: false).standardizedFileURL.path
    }

    /// The absolute path with symbolic links resolved, as the mount table names it. Only the
    /// parent is resolved when the last component cannot be (a mount whose daemon died answers
    /// `ENOTCONN` to everything), so that such a mount can still be found and unmounted.
    static func resolved(_ path: String) -> String {
        let absolute = absolute(path)
        if let real = realPath(absolute) { return real }
        let url = URL(fileURLWithPath: absolute)
        let parent = url.deletingLastPathComponent().path
        guard absolute != "/", let realParent = realPath(parent) else { return absolute }
        return realParent == "/" ? "/" + url.lastPathComponent : realParent + "/" + url.lastPathComponent
    }

    /// The absolute path with the parent's symbolic links resolved and the last component as
    /// given: it never enters `path` itself, so a mount whose daemon hangs cannot block it.
    static func resolvedParent(_ path: String) -> String {
        let absolute = absolute(path)
        let url = URL(fileURLWithPath: absolute, isDirectory: false)
        guard absolute != "/", let realParent = realPath(url.deletingLastPathComponent().path) else {
            return absolute
        }
        return realParent == "/" ? "/" + url.lastPathComponent : realParent + "/" + url.lastPathComponent
    }

    private static func realPath(_ path: String) -> String? {
        guard let resolved = realpath(path, nil) else { return nil }
        defer { free(resolved) }
        return String(cString: resolved)
    }

    /// `$XDG_STATE_HOME/docfs` (~/.local/state/docfs): the daemons' log and pid files.
    static var stateDirectory: URL { SearchPaths(appID: "docfs").state }

    /// The background daemons' log.
    static var logFile: URL { stateDirectory.appendingPathComponent("docfs.log") }

    /// Creates `url` and its missing parents with mode 0700 (logs name private paths).
    static func makeDirectory(_ url: URL) throws {
        try FileManager.default.createDirectory(
            at: url, withIntermediateDirectories: true, attributes: [.posixPermissions: 0o700])
    }
}

/// The text of `errno` (`strerror`), in lower case as the other messages are.
func errnoText(_ code: Int32 = errno) -> String {
    let text = String(cString: strerror(code))
    return text.prefix(1).lowercased() + text.dropFirst()
}

// MARK: - -o options

/// The `-o` options of `docfs mount` (and of `mount -t fuse.docfs`), split into what docfs
/// handles itself and what goes to libfuse.
struct FuseOptions: Equatable {
    var readOnly = false
    var allowOther = false
    var debug = false
    /// `fsname=`: the source shown in the mount table (default: the store's path).
    var fsName: String?
    /// `nonempty`: mount over a folder that has contents (libfuse 3 no longer checks this, so
    /// docfs does and the option never reaches libfuse).
    var nonEmpty = false
    /// `final_save_retry=SECONDS`: how long the daemon, once unmounted, keeps trying to save
    /// what fails to save (a full disk, a lost server) before it gives it up (default 600).
    var finalSaveRetry: Duration?
    /// `quiet_interval=SECONDS`: how long after its last change a document with unsaved changes
    /// is saved even while its files stay open (default 1 s; saves at close and fsync happen
    /// regardless).
    var quietInterval: Duration?
    /// `attr_timeout=SECONDS` and `entry_timeout=SECONDS`: how long the kernel may answer
    /// `stat` and name lookups from its cache (default 60 s each). Other processes' and other
    /// mounts' saves invalidate those caches whatever the timeout, so a longer one only saves
    /// round trips; 0 asks the daemon every time.
    var attributeTimeout: Duration?
    var entryTimeout: Duration?
    /// `collect_interval=SECONDS`: how often the store's retention policy is applied in the
    /// background (default 3600; 0 never).
    var collectInterval: Duration??
    /// `archives=xml`: binary property lists (keyed archives) read and are edited as XML text;
    /// `archives=binary` (the default) shows the stored bytes.
    var archivesAsText = false
    /// `housekeeping=keep`: file managers' `.DS_Store`, `._*`, `Thumbs.db` and `desktop.ini`
    /// are saved like any file; `housekeeping=scratch` (the default) keeps them out of the store.
    var keepHousekeeping = false
    /// `writeback_cache` lets the kernel cache and merge writes; `no_writeback_cache` sends every
    /// write(2) to the daemon as it happens. Nil: the store's default (on for a store file, off
    /// for a PostgreSQL store).
    var writebackCache: Bool?
    /// `close_to_open`: a close of a changed file returns once it is saved, so that an open on
    /// another mount sees it; `no_close_to_open` queues the save. Nil: the store's default (off
    /// for a store file, on for a PostgreSQL store).
    var closeToOpen: Bool?
    /// Everything else, as written, for libfuse (which refuses what it does not know).
    var passThrough: [String] = []

    /// Options mount(8) and mount.fuse3 add or keep that mean nothing for a docfs mount.
    /// mount.fuse3 run by root adds `dev,suid` to every mount, and `user`, `noauto`, `_netdev`
    /// and `defaults` are about fstab; libfuse would refuse the latter. A docfs mount stays
    /// `nosuid,nodev` (libfuse's default), whatever is asked: a store's file modes are not a
    /// reason to honour set-user-id bits or device nodes.
    static let ignored: Set<String> = [
        "dev", "suid", "nodev", "nosuid", "exec", "auto", "noauto", "user", "nouser", "users", "owner",
        "group", "_netdev", "defaults", "nofail",
    ]

    init(_ arguments: [String]) throws {
        for argument in arguments {
            for option in Self.split(argument) where !option.isEmpty {
                try apply(option)
            }
        }
    }

    private mutating func apply(_ option: String) throws {
        let name = option.split(separator: "=", maxSplits: 1).first.map(String.init) ?? option
        let value = option.contains("=") ? String(option.drop { $0 != "=" }.dropFirst()) : nil
        switch name {
        case "ro": readOnly = true
        case "rw": readOnly = false
        case "allow_other": allowOther = true
        case "debug": debug = true
        case "nonempty": nonEmpty = true
        case "fsname":
            guard let value, !value.isEmpty else { throw Failure("-o fsname= needs a name") }
            fsName = Self.unescape(value)
        case "quiet_interval":
            guard let value, let seconds = Double(value), seconds.isFinite, seconds > 0, seconds <= 86400
            else {
                throw Failure("-o quiet_interval= needs a number of seconds above 0 and at most 86400")
            }
            quietInterval = .milliseconds(Int64((seconds * 1000).rounded(.up)))
        case "final_save_retry":
            guard let value, let seconds = Double(value), seconds.isFinite, seconds >= 0, seconds <= 86400
            else {
                throw Failure("-o final_save_retry= needs a number of seconds from 0 to 86400")
            }
            finalSaveRetry = .milliseconds(Int64((seconds * 1000).rounded()))
        case "collect_interval":
            guard let value, let seconds = Double(value), seconds.isFinite, seconds >= 0,
                seconds <= 31_536_000
            else {
                throw Failure("-o collect_interval= needs a number of seconds from 0 (never) to 31536000")
            }
            collectInterval = .some(seconds == 0 ? nil : .milliseconds(Int64((seconds * 1000).rounded(.up))))
        case "attr_timeout", "entry_timeout":
            // The names (and meaning) of libfuse's high-level and sshfs's options of the same names.
            guard let value, let seconds = Double(value), seconds.isFinite, seconds >= 0, seconds <= 86400
            else {
                throw Failure("-o \(name)= needs a number of seconds from 0 to 86400")
            }
            let timeout = Duration.milliseconds(Int64((seconds * 1000).rounded()))
            if name == "attr_timeout" { attributeTimeout = timeout } else { entryTimeout = timeout }
        case "archives":
            switch value {
            case "xml": archivesAsText = true
            case "binary": archivesAsText = false
            default: throw Failure("-o archives= is xml (binary property lists read as XML text) or binary")
            }
        case "housekeeping":
            switch value {
            case "keep": keepHousekeeping = true
            case "scratch": keepHousekeeping = false
            default: throw Failure("-o housekeeping= is scratch (the default: never stored) or keep")
            }
        case "writeback_cache": writebackCache = true
        case "no_writeback_cache": writebackCache = false
        case "close_to_open": closeToOpen = true
        case "no_close_to_open": closeToOpen = false
        case "subtype":
            throw Failure("-o subtype= cannot be changed: docfs mounts are always of type fuse.docfs")
        default:
            // x-* and comment= are mount(8)'s notes for itself (systemd, udisks).
            if Self.ignored.contains(option) || name.hasPrefix("x-") || name == "comment" { return }
            passThrough.append(option)
        }
    }

    /// Splits at commas that are not escaped with a backslash (as libfuse does), keeping the
    /// escapes so that pass-through options reach libfuse as written.
    static func split(_ text: String) -> [String] {
        var parts: [String] = []
        var current = ""
        var escaped = false
        for character in text {
            if escaped {
                current.append(character)
                escaped = false
            } else if character == "\\" {
                current.append(character)
                escaped = true
            } else if character == "," {
                parts.append(current)
                current = ""
            } else {
                current.append(character)
            }
        }
        parts.append(current)
        return parts
    }

    static func unescape(_ text: String) -> String {
        var result = ""
        var escaped = false
        for character in text {
            if escaped || character != "\\" {
                result.append(character)
                escaped = false
            } else {
                escaped = true
            }
        }
        return result
    }
}

// MARK: - The daemon's pid file

/// The pid file a serving `docfs mount` keeps, so that `docfs unmount` can wait until the
/// daemon has finished (saved what was pending and exited), not only until the mount is gone.
struct DaemonRecord: Equatable {
    var pid: pid_t
    /// The process's start time (clock ticks after boot), so that a recycled pid is not taken
    /// for the daemon after a crash or a reboot left the file behind.
    var startTime: UInt64
    var mountpoint: String
    var store: String

    static var directory: URL { MountPaths.stateDirectory.appendingPathComponent("mounts") }

    /// The file for `mountpoint`: its path with `%` and `/` escaped; a long path is shortened
    /// and made unique with a hash, since a file name has at most 255 bytes.
    static func file(for mountpoint: String) -> URL {
        var name = mountpoint.replacingOccurrences(of: "%", with: "%25")
            .replacingOccurrences(of: "/", with: "%2F")
        if name.utf8.count > 200 {
            var hash: UInt64 = 0xcbf2_9ce4_8422_2325
            for byte in mountpoint.utf8 { hash = (hash ^ UInt64(byte)) &* 0x100_0000_01b3 }
            name = String(hash, radix: 16)
        }
        return directory.appendingPathComponent(name + ".pid")
    }

    /// This process, serving `mountpoint`.
    static func current(mountpoint: String, store: String) -> DaemonRecord? {
        guard let start = ProcessStatus(pid: getpid())?.startTime else { return nil }
        return DaemonRecord(pid: getpid(), startTime: start, mountpoint: mountpoint, store: store)
    }

    /// Writes the file (atomically, so a reader never sees half of it).
    func write() throws {
        try MountPaths.makeDirectory(Self.directory)
        let text = "\(pid) \(startTime)\n\(mountpoint)\n\(store)\n"
        try Data(text.utf8).write(to: Self.file(for: mountpoint), options: .atomic)
    }

    /// The file beside the pid file in which a daemon that could not save everything at its
    /// end says what (for `docfs unmount`): the record's first line, then `retrying` or
    /// `lost`, then a line for each document.
    static func unsavedFile(for mountpoint: String) -> URL {
        file(for: mountpoint).deletingPathExtension().appendingPathExtension("unsaved")
    }

    /// Says what this daemon could not save (`lost` once it gave up), or that it saved it all
    /// after all (`documents` empty: the file goes).
    func reportUnsaved(_ documents: [String], lost: Bool) {
        let url = Self.unsavedFile(for: mountpoint)
        guard !documents.isEmpty else {
            try? FileManager.default.removeItem(at: url)
            return
        }
        let text =
            "\(pid) \(startTime)\n\(lost ? "lost" : "retrying")\n" + documents.joined(separator: "\n") + "\n"
        try? Data(text.utf8).write(to: url, options: .atomic)
    }

    /// What this daemon said it could not save, and whether it gave up; nil if it said nothing.
    func unsaved() -> (documents: [String], lost: Bool)? {
        guard let text = try? String(contentsOf: Self.unsavedFile(for: mountpoint), encoding: .utf8) else {
            return nil
        }
        let lines = text.split(separator: "\n").map(String.init)
        guard lines.count >= 3, lines[0] == "\(pid) \(startTime)" else { return nil }
        return (Array(lines[2...]), lines[1] == "lost")
    }

    /// Removes the file if it still describes this process (a later mount may have replaced it).
    func remove() {
        let url = Self.file(for: mountpoint)
        if Self.read(url) == self { try? FileManager.default.removeItem(at: url) }
    }

    static func read(_ url: URL) -> DaemonRecord? {
        guard let text = try? String(contentsOf: url, encoding: .utf8) else { return nil }
        let lines = text.split(separator: "\n", omittingEmptySubsequences: false).map(String.init)
        guard lines.count >= 3 else { return nil }
        let numbers = lines[0].split(separator: " ")
        guard numbers.count == 2, let pid = pid_t(numbers[0]), let start = UInt64(numbers[1]) else {
            return nil
        }
        return DaemonRecord(pid: pid, startTime: start, mountpoint: lines[1], store: lines[2])
    }

    /// Whether the process is still alive (a zombie has finished: its parent has just not
    /// collected it yet).
    var isRunning: Bool {
        guard let status = ProcessStatus(pid: pid) else { return false }
        return status.startTime == startTime && status.state != "Z" && status.state != "X"
    }

    /// The daemon serving `mountpoint`: from the pid file, or else found among the processes
    /// (a daemon started with another `XDG_STATE_HOME`, by mount(8) for instance).
    static func find(mountpoint: String) -> DaemonRecord? {
        if let record = read(file(for: mountpoint)), record.mountpoint == mountpoint, record.isRunning {
            return record
        }
        return scan(mountpoint: mountpoint)
    }

    /// A `docfs mount` process whose arguments name `mountpoint` (the daemon is always started
    /// with the absolute path).
    private static func scan(mountpoint: String) -> DaemonRecord? {
        guard let names = try? FileManager.default.contentsOfDirectory(atPath: "/proc") else { return nil }
        for name in names {
            guard let pid = pid_t(name), pid != getpid(),
                let data = FileManager.default.contents(atPath: "/proc/\(pid)/cmdline")
            else { continue }
            let arguments = data.split(separator: 0).map { String(decoding: $0, as: UTF8.self) }
            guard let program = arguments.first,
                URL(fileURLWithPath: program).lastPathComponent == "docfs",
                arguments.contains("mount"), arguments.contains(mountpoint),
                let status = ProcessStatus(pid: pid), status.state != "Z"
            else { continue }
            return DaemonRecord(pid: pid, startTime: status.startTime, mountpoint: mountpoint, store: "")
        }
        return nil
    }
}

/// What `/proc/PID/stat` says about a process.
struct ProcessStatus {
    var state: Character
    var startTime: UInt64

    init?(pid: pid_t) {
        guard let data = FileManager.default.contents(atPath: "/proc/\(pid)/stat") else { return nil }
        let text = String(decoding: data, as: UTF8.self)
        // The command name (field 2) is in parentheses and may itself contain spaces and ")".
        guard let close = text.lastIndex(of: ")") else { return nil }
        let fields = text[text.index(after: close)...].split(separator: " ")
        // fields[0] is field 3 (state); the start time is field 22.
        guard fields.count > 19, let state = fields[0].first, let start = UInt64(fields[19]) else {
            return nil
        }
        self.state = state
        startTime = start
    }
}

// MARK: - mount(8)'s helper convention

/// `mount -t fuse.docfs STORE MOUNTPOINT -o OPTIONS` (or an fstab line of type `fuse.docfs`)
/// runs mount.fuse3, which runs `docfs STORE MOUNTPOINT -o OPTIONS` through /bin/sh.
enum MountHelper {
    /// The arguments as a `docfs mount` command when `arguments` (without the program name)
    /// have that shape: a first argument that is not a command, an absolute second one
    /// (mount(8) always passes the mount point absolute), then nothing or `-o OPTIONS`.
    static func rewrite(_ arguments: [String], commands: Set<String>) -> [String]? {
        guard arguments.count == 2 || (arguments.count == 4 && arguments[2] == "-o") else { return nil }
        let source = arguments[0]
        let mountpoint = arguments[1]
        guard !source.isEmpty, !source.hasPrefix("-"), !commands.contains(source), mountpoint.hasPrefix("/")
        else { return nil }
        return ["mount"] + arguments
    }

    /// `docfs mount … -oro,allow_other` as `-o ro,allow_other`, as mount(8) and sshfs accept.
    /// (ArgumentParser's joined short options would take `-ofsname=x` for an option named
    /// `ofsname`.)
    static func splitJoinedOptions(_ arguments: [String]) -> [String] {
        guard arguments.first == "mount" else { return arguments }
        var result: [String] = []
        var afterTerminator = false
        for argument in arguments {
            if !afterTerminator, argument.hasPrefix("-o"), argument.count > 2 {
                result += ["-o", String(argument.dropFirst(2))]
            } else {
                if argument == "--" { afterTerminator = true }
                result.append(argument)
            }
        }
        return result
    }
}

// MARK: - libfuse's judgement of the options

extension FuseOptions {
    /// The pass-through options libfuse does not know, in the order given.
    ///
    /// Asking before the real session is created gives a message that names the option, and
    /// keeps today's FUSE layer off its session-creation error path, which crashes.
    func refusedByLibfuse() -> [String] {
        passThrough.filter { !MountOptions.libfuseAccepts(option: $0) }
    }
}
