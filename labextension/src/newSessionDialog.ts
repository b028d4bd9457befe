/**
 * The new-session dialog. "Start" checks the form (its own check, then the server's,
 * ``POST /sessions?validate=true``) and then starts the session with the dialog still open:
 * the form says what the start does as the server reports it (the model's progress of
 * that session), and closes once the session is ready. A start that fails leaves the form
 * open with the failure under the field it is about, in the form's words (a Ray address
 * where no cluster answers: under "Ray address"), and everything typed kept. "Cancel"
 * during a start closes the form; the start goes on, and a notification says how it ends.
 */
import { Dialog, Notification } from '@jupyterlab/apputils';

import { fieldOfFailure, inFormWords } from './formWords';
import { SessionsModel } from './model';
import { INewSession, NewSessionForm, checkForm, fieldOfMessage, requestOf } from './newSessionForm';
import { ApiError, requestAPI } from './request';

export class NewSessionDialog extends Dialog<INewSession> {
  constructor(
    private form: NewSessionForm,
    private model: SessionsModel
  ) {
    super({
      title: 'New distributed session',
      body: form,
      buttons: [Dialog.cancelButton(), Dialog.okButton({ label: 'Start' })],
      defaultButton: 1,
      focusNodeSelector: 'input'
    });
    void form.profiles.load();
  }

  resolve(index?: number): void {
    if ((index ?? 1) !== 1) {
      this.closing();
      super.resolve(index);
      return;
    }
    if (this.busy || this.form.profiles.takesEnter()) {
      return;
    }
    this.busy = true;
    this.setStartEnabled(false);
    void this.checkAndStart()
      .then(ok => {
        if (ok && !this.isDisposed) {
          super.resolve(1);
        }
      })
      .finally(() => {
        this.busy = false;
        if (!this.isDisposed) {
          this.setStartEnabled(true);
        }
      });
  }

  /** Escape, the close button, a click beside the dialog. */
  reject(): void {
    this.closing();
    super.reject();
  }

  /** Closed while the session starts: the start goes on, a notification follows it. */
  private closing(): void {
    if (this.starting && !this.notice) {
      this.notice = Notification.emit(`Starting session ${this.starting}…`, 'in-progress', {
        autoClose: false
      });
    }
  }

  private setStartEnabled(enabled: boolean): void {
    const start = this.node.querySelector<HTMLButtonElement>('.jp-Dialog-button.jp-mod-accept');
    if (start) {
      start.disabled = !enabled;
      start.setAttribute('aria-disabled', String(!enabled));
    }
  }

  /** Check the form, then start the session; true once it is ready. */
  private async checkAndStart(): Promise<boolean> {
    const value = this.form.getValue();
    this.form.clear();
    const wrong = checkForm(value);
    if (Object.keys(wrong).length) {
      this.form.showErrors(wrong);
      return false;
    }
    try {
      const reply = await requestAPI<{ valid: boolean; message?: string }>(
        'sessions',
        { method: 'POST', body: JSON.stringify(requestOf(value)) },
        { validate: 'true' }
      );
      if (!reply.valid) {
        const message = reply.message ?? 'the server refused these values';
        this.form.showErrors({ [fieldOfMessage(message) ?? 'form']: message });
        return false;
      }
    } catch (error) {
      const message = error instanceof ApiError ? error.message : `${error}`;
      this.form.showErrors({ form: `The server could not check the form: ${message}` });
      return false;
    }
    return this.start(value);
  }

  /** ``POST /sessions``, the form saying what the start does meanwhile. */
  private async start(value: INewSession): Promise<boolean> {
    const body = requestOf(value);
    const name = String(body.name);
    this.starting = name;
    const say = () => {
      const now = this.model.progressOf(name);
      this.form.showProgress(`Starting session ${name}${now ? `: ${inFormWords(now)}` : '…'}`);
    };
    say();
    this.model.changed.connect(say);
    try {
      await requestAPI('sessions', { method: 'POST', body: JSON.stringify(body) });
      this.ended(name, `Session ${name} is ready`, 'success');
      return true;
    } catch (error) {
      const message = error instanceof ApiError ? error.message : `${error}`;
      if (this.isDisposed) {
        this.ended(name, `Starting session ${name} failed: ${message}`, 'error');
      } else {
        const field = fieldOfFailure(message) ?? fieldOfMessage(message) ?? 'form';
        this.form.showErrors({ [field]: message });
      }
      return false;
    } finally {
      this.model.changed.disconnect(say);
      this.starting = '';
      if (!this.isDisposed) {
        this.form.showProgress('');
      }
    }
  }

  /** How a start ended, as a notification: the one the closed form left, or a new one. */
  private ended(name: string, message: string, type: 'success' | 'error'): void {
    const autoClose = type === 'success' ? 4000 : 10000;
    if (this.notice) {
      Notification.update({ id: this.notice, message, type, autoClose });
      this.notice = '';
    } else {
      Notification.emit(message, type, { autoClose });
    }
  }

  private busy = false;
  /** The session being started, '' when none is. */
  private starting = '';
  /** The notification that follows a start the form was closed during. */
  private notice = '';
}
