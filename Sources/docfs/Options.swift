import ArgumentParser
import DocumentEngine
import Foundation
import Logging
import PostgresStore
import SQLiteStore
import VersionedStore

#if canImport(Glibc)
    import Glibc
#endif

/// `--log-level`'s values: swift-log's levels (a wrapper, since conforming `Logger.Level` itself
/// to ArgumentParser's protocol would be a retroactive conformance).
enum LogLevel: String, CaseIterable, ExpressibleByArgument {
    case trace, debug, info, notice, warning, error, critical

    var level: Logger.Level { Logger.Level(rawValue: rawValue) ?? .warning }
}

/// Options every subcommand takes.
struct GlobalOptions: ParsableArguments {
    @Option(help: "How much the engine and the command log on standard error.")
    var logLevel: LogLevel = .warning

    /// Sends every logger (the command's and the engine's) to standard error at `logLevel`.
    /// Called once, at the start of a command's `run()`.
    func bootstrap() -> Logger {
        let level = logLevel.level
        LoggingSystem.bootstrap { label in
            var handler = StreamLogHandler.standardError(label: label)
            handler.logLevel = level
            return handler
        }
        return Logger(label: "docfs")
    }
}

/// Where a store is, and how to open it: an SQLite file, or a PostgreSQL database named by a
/// `postgres://` URL (with libpq's PG* environment variables for what the URL leaves out).
struct StoreLocation {
    /// The store file's absolute path, or the database's URL without its password (for messages).
    var path: String
    /// As given on the command line (a URL keeps its password), to hand to the daemon.
    var argument: String
    /// Whether the path is the default store's (for messages).
    var isDefault: Bool
    /// The PostgreSQL database, for a `postgres://` URL.
    var postgres: PostgresStore.Configuration?

    /// The store named on the command line, or the default store when `argument` is nil.
    init(_ argument: String?) throws {
        if let argument, PostgresStore.Configuration.isURL(argument) {
            let configuration = try PostgresStore.Configuration(url: argument)
            postgres = configuration
            path = configuration.url
            self.argument = argument
            isDefault = false
        } else if let argument {
            // Absolute, so that messages name the file the user can find.
            path = URL(fileURLWithPath: argument).standardizedFileURL.path
            self.argument = path
            isDefault = false
        } else {
            path = SQLiteStore.defaultStorePath()
            self.argument = path
            isDefault = true
        }
    }

    /// Opens the existing store. A missing file gets its own message (with the command that
    /// creates one); everything else is the engine's error, which names the problem.
    func open(logger: Logger) throws -> any VersionedDocumentStore {
        if let postgres {
            logger.debug("opening the store", metadata: ["url": "\(path)"])
            do {
                return try PostgresStore(configuration: postgres, logger: logger)
            } catch DocumentStoreError.notAStore(_, let reason) {
                throw Failure(
                    "no store at \(path) (\(reason)); create one with `docfs create \(shellQuoted(path))`")
            }
        }
        var st = stat()
        if stat(path, &st) != 0, errno == ENOENT {
            let create = isDefault ? "docfs create" : "docfs create \(shellQuoted(path))"
            throw Failure("no store at \(path); create one with `\(create)`")
        }
        logger.debug("opening the store", metadata: ["path": "\(path)"])
        let store = try SQLiteStore(path: path)
        logger.debug("opened the store", metadata: ["chunkSize": "\(store.chunkSize)"])
        return store
    }
}

/// Splits positional arguments into the optional leading STORE and the ones the command needs.
///
/// The rule (documented in `docfs --help`): when one more argument is given than the command
/// needs, the first is the STORE; when exactly as many are given, the default store is used.
enum Positionals {
    /// `[STORE] [NAME]`: a lone argument is a STORE when it looks like one, else a NAME (`what`
    /// says which, for the message).
    static func optionalStoreAndName(_ arguments: [String], what: String) throws -> (
        store: String?, name: String?
    ) {
        switch arguments.count {
        case 0: return (nil, nil)
        case 1:
            let only = arguments[0]
            return looksLikeStore(only) ? (only, nil) : (nil, only)
        case 2: return (arguments[0], arguments[1])
        default: throw ValidationError("expected [STORE] [\(what)], but got \(arguments.count) arguments")
        }
    }

    static func split(_ arguments: [String], needs names: [String]) throws -> (store: String?, rest: [String])
    {
        switch arguments.count {
        case names.count: return (nil, arguments)
        case names.count + 1: return (arguments[0], Array(arguments.dropFirst()))
        default:
            let usage = (["[STORE]"] + names).joined(separator: " ")
            throw ValidationError(
                "expected \(usage), but got \(arguments.count) argument\(arguments.count == 1 ? "" : "s")")
        }
    }

    /// Whether a lone argument of `docfs ls` names a store file rather than a document: it
    /// contains a "/" (which no document name can) or ends in ".docstore".
    static func looksLikeStore(_ argument: String) -> Bool {
        argument.contains("/") || argument.hasSuffix(".docstore")
    }
}

/// A version id as `docfs versions` prints it: a number, optionally written `v12`.
struct VersionArgument: ExpressibleByArgument {
    var id: VersionID

    init?(argument: String) {
        let digits = argument.hasPrefix("v") ? String(argument.dropFirst()) : argument
        guard let raw = Int64(digits), raw > 0 else { return nil }
        id = VersionID(rawValue: raw)
    }
}

/// A length of time such as `30d`, `12h`, `90m`, `45s`, `2w` or `1d12h`; `0` means none.
struct DurationArgument: ExpressibleByArgument {
    var duration: Duration

    init?(argument: String) {
        if argument == "0" {
            duration = .zero
            return
        }
        let units: [Character: Int64] = ["s": 1, "m": 60, "h": 3600, "d": 86_400, "w": 604_800]
        var seconds: Int64 = 0
        var number = ""
        for character in argument {
            if character.isASCII, character.isNumber {
                number.append(character)
            } else if let unit = units[character], let value = Int64(number) {
                let (product, overflow1) = value.multipliedReportingOverflow(by: unit)
                let (sum, overflow2) = seconds.addingReportingOverflow(product)
                guard !overflow1, !overflow2 else { return nil }
                seconds = sum
                number = ""
            } else {
                return nil
            }
        }
        // A trailing number without a unit is ambiguous (seconds? days?), so it is refused.
        guard number.isEmpty, !argument.isEmpty else { return nil }
        duration = .seconds(seconds)
    }
}

/// A byte count such as `262144`, `256K` or `1M` (binary units).
struct ByteCountArgument: ExpressibleByArgument {
    var bytes: Int

    init?(argument: String) {
        var digits = Substring(argument)
        var multiplier = 1
        switch digits.last {
        case "k", "K":
            multiplier = 1024
            digits = digits.dropLast()
        case "m", "M":
            multiplier = 1024 * 1024
            digits = digits.dropLast()
        default: break
        }
        guard let value = Int(digits), value > 0 else { return nil }
        let (product, overflow) = value.multipliedReportingOverflow(by: multiplier)
        guard !overflow else { return nil }
        bytes = product
    }
}

/// `text` quoted for a POSIX shell when it needs to be, for commands printed in messages.
func shellQuoted(_ text: String) -> String {
    let safe = CharacterSet(
        charactersIn: "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_./=:+,@%")
    if !text.isEmpty, text.unicodeScalars.allSatisfy({ safe.contains($0) }) { return text }
    return "'" + text.replacingOccurrences(of: "'", with: "'\\''") + "'"
}

/// Looks a live document up by name.
func liveDocument(named name: String, in store: any DocumentStore) throws -> DocumentInfo {
    guard let info = try store.document(named: name) else { throw DocumentStoreError.noSuchDocument(name) }
    return info
}
