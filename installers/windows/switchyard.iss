; Inno Setup 6 script: a per-user or per-machine installer for the one-folder bundle dist\switchyard\.
;
;   make package                      (on Windows: .venv\Scripts\pyinstaller --noconfirm build.spec)
;   iscc /DAppVersion=0.1.0 installers\windows\switchyard.iss
;
; writes dist\switchyard-<version>-setup.exe. Paths below are relative to this file.
; Start-menu entry; an optional task starts Switchyard when the user signs in; the uninstaller stops a
; running Switchyard (its window, tray and server, then any lane it started) before removing files.

#ifndef AppVersion
  #define AppVersion "0.0.0"
#endif

[Setup]
AppId={{6E0B7C1A-3F2D-4C59-9A7E-5D21B8C4F0A3}
AppName=Switchyard
AppVersion={#AppVersion}
AppVerName=Switchyard {#AppVersion}
AppPublisher=Switchyard developers
DefaultDirName={autopf}\Switchyard
DefaultGroupName=Switchyard
DisableProgramGroupPage=yes
; per-user install by default (no UAC prompt); the dialog offers all users
PrivilegesRequired=lowest
PrivilegesRequiredOverridesAllowed=dialog
ArchitecturesAllowed=x64compatible
ArchitecturesInstallIn64BitMode=x64compatible
OutputDir=..\..\dist
OutputBaseFilename=switchyard-{#AppVersion}-setup
SetupIconFile=..\..\resources\icons\switchyard.ico
UninstallDisplayIcon={app}\switchyardw.exe
UninstallDisplayName=Switchyard
Compression=lzma2/max
SolidCompression=yes
WizardStyle=modern
; an update or uninstall asks the running app to close (Restart Manager) instead of failing on locked files
CloseApplications=yes
RestartApplications=no

[Tasks]
Name: "startup"; Description: "Start Switchyard when I sign in (it waits in the tray)"; Flags: unchecked
Name: "desktopicon"; Description: "{cm:CreateDesktopIcon}"; GroupDescription: "{cm:AdditionalIcons}"; Flags: unchecked

[Files]
Source: "..\..\dist\switchyard\*"; DestDir: "{app}"; Flags: ignoreversion recursesubdirs createallsubdirs

[Icons]
Name: "{group}\Switchyard"; Filename: "{app}\switchyardw.exe"; Parameters: "gui"; IconFilename: "{app}\switchyardw.exe"
Name: "{group}\Uninstall Switchyard"; Filename: "{uninstallexe}"
Name: "{autodesktop}\Switchyard"; Filename: "{app}\switchyardw.exe"; Parameters: "gui"; Tasks: desktopicon
Name: "{userstartup}\Switchyard"; Filename: "{app}\switchyardw.exe"; Parameters: "gui"; Tasks: startup

[Run]
Filename: "{app}\switchyardw.exe"; Parameters: "gui"; Description: "{cm:LaunchProgram,Switchyard}"; Flags: nowait postinstall skipifsilent

[UninstallDelete]
; PyInstaller's bundle writes nothing else here; models and settings live in %LOCALAPPDATA%\Switchyard
; and are kept (docs/install.md says how to remove them)
Type: filesandordirs; Name: "{app}\_internal\__pycache__"

[Code]
{ Stop Switchyard before its files are removed: ask politely (the window quits, stopping its lanes), wait,
  then end whatever is left, lanes included (/T: the process tree). }
procedure StopSwitchyard();
var
  Code: Integer;
begin
  Exec(ExpandConstant('{sys}\taskkill.exe'), '/IM switchyardw.exe /T', '', SW_HIDE, ewWaitUntilTerminated, Code);
  Exec(ExpandConstant('{sys}\taskkill.exe'), '/IM switchyard.exe /T', '', SW_HIDE, ewWaitUntilTerminated, Code);
  Sleep(3000);
  Exec(ExpandConstant('{sys}\taskkill.exe'), '/F /IM switchyardw.exe /T', '', SW_HIDE, ewWaitUntilTerminated, Code);
  Exec(ExpandConstant('{sys}\taskkill.exe'), '/F /IM switchyard.exe /T', '', SW_HIDE, ewWaitUntilTerminated, Code);
end;

function InitializeUninstall(): Boolean;
begin
  StopSwitchyard();
  Result := True;
end;
