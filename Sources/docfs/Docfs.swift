import ArgumentParser
import DocumentEngine
import DocumentFS
import Foundation

#if canImport(Glibc)
    import Glibc
#endif

/// The `docfs` command: a thin front end to the document engine. Each subcommand parses its
/// arguments, calls the engine, and prints; the logic lives in `DocumentEngine`.
struct Docfs: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "docfs",
        abstract: "DocFS: document stores as file systems.",
        discussion: """
            A store holds documents and every saved version of them: an SQLite file, or a \
            PostgreSQL database named by a postgres:// URL. Without a STORE argument, commands \
            use the default store, $XDG_DATA_HOME/docfs/Documents/Default.docstore \
            (~/.local/share/docfs/Documents/Default.docstore).

            STORE is an optional first argument: a command that needs other arguments (a \
            DOCUMENT, a PATH) takes the first of them as STORE only when one more argument is \
            given than the command needs. `docfs ls` needs none, so its single argument is a \
            STORE when it contains a "/" or ends in ".docstore" (document names never contain \
            a "/"), and otherwise a DOCUMENT of the default store.

            Errors are one line on standard error, starting with "docfs: ", and a non-zero exit \
            status.

            `docfs STORE /MOUNTPOINT [-o OPTIONS]` is `docfs mount`: the form mount.fuse3 uses \
            for `mount -t fuse.docfs` and fstab lines.
            """,
        version: DocumentFS.version,
        subcommands: [
            Create.self, List.self, Versions.self, Restore.self, Fsck.self, Import.self, Export.self,
            CollectGarbage.self, Retention.self, PropertyListCommand.self, Mount.self, Unmount.self,
        ]
    )
}

/// A `docfs` subcommand (not one of ArgumentParser's built-in ones, such as `help`): its errors
/// are printed as `docfs: <message>`.
protocol DocfsCommand: AsyncParsableCommand {}

/// The entry point. It is ArgumentParser's `main()` with one difference: an error from running
/// one of docfs's commands (not from parsing it) is printed as one line, `docfs: <message>`,
/// never as a dump of the error value.
@main
enum DocfsMain {
    static func main() async {
        do {
            var command = try Docfs.parseAsRoot(arguments())
            guard var docfsCommand = command as? any DocfsCommand else {
                // `docfs`, `docfs help …`: ArgumentParser's own commands, whose run() reports
                // help through errors that `exit(withError:)` below understands.
                try command.run()
                return
            }
            do {
                try await docfsCommand.run()
            } catch let error as ExitCode {
                throw error
            } catch let error as CleanExit {
                throw error
            } catch {
                let failure = error as? Failure ?? Failure(error)
                printError(failure.message)
                throw ExitCode(failure.exitCode)
            }
        } catch {
            // Usage errors, --help and --version, and exit codes: ArgumentParser's messages.
            Docfs.exit(withError: error)
        }
    }
}

extension DocfsMain {
    /// The command line without the program name; mount.fuse3's form (see ``MountHelper``)
    /// becomes a `docfs mount` command.
    static func arguments() -> [String] {
        let arguments = Array(CommandLine.arguments.dropFirst())
        let commands = Set(Docfs.configuration.subcommands.map { $0._commandName } + ["help"])
        return MountHelper.splitJoinedOptions(MountHelper.rewrite(arguments, commands: commands) ?? arguments)
    }
}

/// A command failure: a message for one line on standard error and an exit status.
struct Failure: Error, CustomStringConvertible {
    var message: String
    var exitCode: Int32

    init(_ message: String, exitCode: Int32 = 1) {
        self.message = message
        self.exitCode = exitCode
    }

    /// Any error with its one-line description (a `Failure`'s message), exiting with `exitCode`.
    init(_ error: any Error, exitCode: Int32 = 1) {
        self.init((error as? Failure)?.message ?? Self.describe(error), exitCode: exitCode)
    }

    var description: String { message }

    /// The error's description, on one line. Store errors describe themselves
    /// (`DocumentStoreError.description` names the store and the problem); other errors give
    /// their localized description when they have one.
    static func describe(_ error: any Error) -> String {
        let text: String
        if let error = error as? DocumentStoreError {
            text = error.description
        } else if let error = error as? any LocalizedError, let described = error.errorDescription {
            text = described
        } else {
            text = String(describing: error)
        }
        return text.split(whereSeparator: \.isNewline).joined(separator: " ")
    }
}

/// Writes `docfs: <message>` on standard error.
func printError(_ message: String) {
    FileHandle.standardError.write(Data("docfs: \(message)\n".utf8))
}
